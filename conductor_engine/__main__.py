"""`python -m conductor_engine` is the `conductor` command."""

from conductor_engine.runtime.cli import main

main()
