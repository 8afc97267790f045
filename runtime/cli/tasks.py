"""`conductor tasks check`: load a task file (or a dataset, or a benchmark's rows) and say
which lines are bad."""

from __future__ import annotations

from collections import Counter
from typing import Annotated

import typer
from rich.text import Text

from conductor_engine.engine.tasks.files import MAX_LISTED
from conductor_engine.runtime.cli.app import (
    err,
    fail,
    tasks_app,
)


@tasks_app.command("check")
def tasks_check(
    source: Annotated[str, typer.Argument(
        help="a JSONL file, hf:NAME[:CONFIG][@SPLIT], or a benchmark's rows as SHAPE:SOURCE "
             "(docs/how-to/benchmarks.md)")],
    as_json: Annotated[bool, typer.Option("--json", help="the valid tasks as JSON lines")] = False,
    all_errors: Annotated[bool, typer.Option(
        "--all", help=f"list every bad line, not the first {MAX_LISTED}")] = False,
) -> None:
    """Load a task file: count the valid tasks, list bad lines as FILE:LINE: why (exit 1)."""
    from conductor_engine.engine.tasks.files import TaskFileError
    from conductor_engine.engine.tasks.sources import load_tasks

    try:
        loaded = load_tasks(source)
    except TaskFileError as e:
        raise fail(str(e)) from None
    if as_json:
        for t in loaded.tasks:
            print(t.model_dump_json(exclude_defaults=True))
    verifiers = Counter(t.verifier or "auto" for t in loaded.tasks)
    err.print(Text(f"{len(loaded.tasks)} task(s) ok in {loaded.path} · verifiers: "
                   + (", ".join(f"{k} {v}" for k, v in sorted(verifiers.items())) or "none")),
              highlight=False, soft_wrap=True)
    for line in loaded.error_lines(None if all_errors else MAX_LISTED):
        err.print(Text(line), highlight=False, soft_wrap=True)
    if loaded.errors:
        raise typer.Exit(1)
