"""What the `conductor` commands share: the Typer apps, the Rich consoles, settings, pool and
task-file loading, the trace store, the in-process worker, and the one way a command fails (a
single `error: ...` line).

Command modules import from here (and from render.py); nothing here imports a command module,
so the package has no import cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import annotated_types
import typer
from pydantic import BaseModel
from rich.console import Console
from rich.text import Text

from conductor_engine.engine.contracts.search_attributes import SearchAttributesMissing
from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.providers.pool import Pool, PoolError
from conductor_engine.engine.settings import Settings, SettingsError
from conductor_engine.engine.storage.codec import CodecError
from conductor_engine.engine.storage.database import DatabaseError, database_url
from conductor_engine.engine.storage.trace_store import TraceStore
from conductor_engine.runtime.client import (
    ConductorClient,
    ConnectError,
    RunFailed,
    TaskTooLarge,
)
from conductor_engine.runtime.embedded import EmbeddedError
from conductor_engine.runtime.logging import configure_logging
from conductor_engine.runtime.telemetry import TelemetryError, flush_traces

# rich_markup_mode=None on every Typer app: help text and docstrings are printed as written, so
# `hf:NAME[@SPLIT]` or `[policy]` show instead of being taken for Rich markup and vanishing.
app = typer.Typer(help="Conductor engine: a conductor model plans, Temporal runs the plan.",
                  no_args_is_help=True, rich_markup_mode=None, pretty_exceptions_enable=False)
pool_app = typer.Typer(help="Inspect the agent pool.", no_args_is_help=True,
                       rich_markup_mode=None)
plan_app = typer.Typer(help="Work with plans.", no_args_is_help=True, rich_markup_mode=None)
traces_app = typer.Typer(help="List and show recorded traces.", no_args_is_help=True,
                         rich_markup_mode=None)
tasks_app = typer.Typer(help="Task files (JSONL, Hugging Face datasets).", no_args_is_help=True,
                        rich_markup_mode=None)
app.add_typer(pool_app, name="pool")
app.add_typer(plan_app, name="plan")
app.add_typer(traces_app, name="traces")
app.add_typer(tasks_app, name="tasks")

# emoji=False: a markup string of ours may hold escaped user text, and `:cat:` in a question
# must print as written, not as an emoji (rich.markup.escape leaves emoji codes alone).
out = Console(emoji=False)
err = Console(stderr=True, emoji=False)
T = TypeVar("T")

PoolOpt = Annotated[Path | None, typer.Option("--pool", help="pool TOML file (default: "
                                              "CONDUCTOR_POOL_FILE or the shipped pool)")]


def field_range(model: type[BaseModel], name: str) -> dict[str, Any]:
    """`min`/`max` for a typer option from a pydantic field's ge/le, so a flag's range and the
    model's never drift apart: `typer.Option(**field_range(RunOptions, "max_steps"))`."""
    bounds: dict[str, Any] = {}
    for rule in model.model_fields[name].metadata:
        if isinstance(rule, annotated_types.Ge):
            bounds["min"] = rule.ge
        elif isinstance(rule, annotated_types.Le):
            bounds["max"] = rule.le
    return bounds


LOG_VARIABLE = "CONDUCTOR_LOG"
"""A level name over `log_level` for one command: `CONDUCTOR_LOG=debug` shows everything,
tracebacks included (settings.OTHER_VARIABLES lists it)."""
LEVELS = ("debug", "info", "warning", "error")
_verbose = False  # the app's --verbose


@app.callback()
def _app_options(verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="log lines from info up, and the traceback of each failure "
        f"(everything: {LOG_VARIABLE}=debug)")] = False) -> None:
    global _verbose
    _verbose = verbose


def _configure_logging(settings: Settings) -> None:
    """Quiet by default (warnings and errors, one line each); more on request: --verbose (info
    and tracebacks), CONDUCTOR_LOG=LEVEL (debug: tracebacks too); JSON lines only with
    log_format = "json"."""
    level = os.environ.get(LOG_VARIABLE, "").strip().lower() or settings.log_level.lower()
    if level not in LEVELS:
        source = LOG_VARIABLE if os.environ.get(LOG_VARIABLE, "").strip() else "log_level"
        raise fail(f"{source}={level!r} is no log level; use one of {', '.join(LEVELS)}", 2)
    if _verbose and level in ("warning", "error"):
        level = "info"
    configure_logging(settings.log_format, level, tracebacks=_verbose or level == "debug")


def load_settings(pool: Path | None = None) -> Settings:
    """Settings from the environment and config file (with --pool over them); logging set up.
    A bad setting is one `error:` line naming its variable or file line, exit status 2."""
    try:
        settings = Settings()
    except SettingsError as e:
        raise fail(str(e), 2) from None
    if pool is not None:
        settings.pool_file = pool
    _configure_logging(settings)
    return settings


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print `error: MESSAGE` on stderr, MESSAGE verbatim (it quotes user and model text, which
    is never Rich markup); the caller raises what this returns."""
    err.print(Text.assemble(("error:", "bold red"), " ", message), highlight=False,
              soft_wrap=True)
    return typer.Exit(code)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine, turning every failure a user can meet into a one-line message."""
    try:
        return asyncio.run(coro)
    except (ConnectError, EmbeddedError, DatabaseError, PoolError, RunFailed, LookupError,
            SearchAttributesMissing, TelemetryError, TaskTooLarge, CodecError) as e:
        raise fail(str(e)) from None
    except KeyboardInterrupt:
        raise fail("interrupted", 130) from None
    finally:
        flush_traces()  # spans of a short command, before the process ends


def load_pool(settings: Settings) -> Pool:
    try:
        return Pool.load(settings.pool_file)
    except PoolError as e:
        raise fail(str(e)) from None


def load_task_file(source: str, *, skip_bad: bool = False, **options: Any) -> list[Task]:
    """The tasks of a JSONL file (or hf:NAME), all of them or none: a file with any bad line
    submits nothing. Each bad line is listed as `FILE:LINE: why` (the first MAX_LISTED, then a
    count), then one `error:` line says how to go on, exit status 1. Skipping bad lines instead
    would submit a different set of tasks than the file holds, which a batch of 10,000 tasks
    would hide: the valid ones are one command away (`tasks check --json`) where that is wanted.

    `skip_bad` (`conductor eval`, whose report counts its tasks): the bad lines are listed the
    same way, then one `warning:` line says how many were left out, and the valid tasks run, so
    one malformed row of a published benchmark does not stop its evaluation.
    """
    from conductor_engine.engine.tasks.files import TaskFileError
    from conductor_engine.engine.tasks.sources import load_tasks

    try:
        loaded = load_tasks(source, **options)
    except TaskFileError as e:
        raise fail(str(e)) from None
    for line in loaded.error_lines():
        err.print(Text(line), highlight=False, soft_wrap=True)
    if loaded.errors and skip_bad and loaded.tasks:
        err.print(Text(f"warning: {len(loaded.errors)} bad line(s) in {loaded.path} left out; "
                       f"{len(loaded.tasks)} valid task(s) run (--strict refuses instead)"),
                  highlight=False, soft_wrap=True)
    elif loaded.errors:
        src = shlex.quote(source)
        raise fail(f"{len(loaded.errors)} bad line(s) in {loaded.path} ({len(loaded.tasks)} "
                   f"valid): nothing was submitted. Fix them (`conductor tasks check {src} "
                   f"--all` lists every one), or go on with the valid tasks only: `conductor "
                   f"tasks check {src} --json > valid.jsonl`, then submit that file")
    if not loaded.tasks:
        raise fail(f"no task in {source}: every line is blank")
    return list(loaded.tasks)


@contextlib.asynccontextmanager
async def open_trace_store(settings: Settings) -> AsyncIterator[TraceStore]:
    """The trace store, on the configured PostgreSQL or the embedded one (started if need be)."""
    from conductor_engine.engine.storage.blobs import blob_store

    url = await asyncio.to_thread(database_url, settings)
    store = await TraceStore.open(url, blob_store(settings),
                                  blob_threshold=settings.trace_blob_threshold, max_size=2)
    try:
        yield store
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def in_process_worker(
    conductor: ConductorClient, pool: Pool, enabled: bool
) -> AsyncIterator[None]:
    """A worker on the task queue for as long as the block runs (when `enabled`), so a command
    on the embedded stack needs no `conductor up` beside it."""
    if not enabled:
        yield
        return
    from conductor_engine.engine.contracts.search_attributes import ensure_registered
    from conductor_engine.engine.providers.local.weights import report_progress_to
    from conductor_engine.engine.storage.shared_store import close_shared_stores
    from conductor_engine.runtime.worker import (
        build_worker,  # imports workflows and activities: runtime only
    )

    await ensure_registered(conductor.client, conductor.settings.temporal_namespace)
    # a first run fetches and converts the local model: a line for each stage, above the
    # command's spinner or bar (terminal or pipe), so the minute it takes says what it does
    report_progress_to(lambda text: err.print(Text(text), highlight=False, soft_wrap=True))
    try:
        async with build_worker(conductor.client, conductor.settings, pool):
            yield
    finally:
        report_progress_to(None)
    await close_shared_stores()
