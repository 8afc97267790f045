"""`python -m engine` is the `conductor` command."""

from engine.cli import main

main()
