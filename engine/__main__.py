"""`python -m engine` is the `conductor` command."""

from conductor_engine.engine.runtime.cli import main

main()
