"""The `conductor` command line (Typer + Rich), a thin layer over the client (runtime/client.py).

One module a concern: app (the Typer apps and what commands share), render (the one step table),
stack (up, down, worker), runs, batches, traces (and history), resume, pool (and plan check),
train, evaluate (`eval`), serve. Importing a command module registers its commands on the app; this
package only does that and exposes `main`, the `conductor` script.
"""

from __future__ import annotations

import os
import sys

# The command modules register their commands as they are imported, so this order is the order
# `conductor --help` lists them in.
# isort: off
from conductor_engine.runtime.cli import (  # noqa: F401
    runs,
    stack,
    pool,
    plan,
    batches,
    tasks,
    traces,
    history,
    resume,
    train,
    evaluate,
    sim,
    serve,
)
# isort: on
from conductor_engine.engine.settings import SettingsError
from conductor_engine.runtime.cli.app import app

__all__ = ["app", "main", "verbose_first"]


def verbose_first(args: list[str]) -> list[str]:
    """`--verbose` is an option of `conductor` itself, and people write it after the command
    too (`conductor run "..." --verbose`): moved to the front, so both work. Not after `--`,
    where every word is an argument."""
    end = args.index("--") if "--" in args else len(args)
    if "--verbose" not in args[:end]:
        return args
    return ["--verbose", *(a for a in args[:end] if a != "--verbose"), *args[end:]]


def main() -> None:  # pragma: no cover
    """The `conductor` command. It leaves through os._exit once its output is flushed: the
    Temporal SDK's Rust core can abort the interpreter's normal shutdown (temporalio/sdk-python
    issue 300), turning a finished command into a crash."""
    code = 0
    try:
        app(args=verbose_first(sys.argv[1:]))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except SettingsError as e:  # settings built outside load_settings: still one line
        sys.stderr.write(f"error: {e}\n")
        code = 2
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)
