"""Running an eval: its runs submitted as one batch, the batch waited for, its traces read back
and the report written. What `conductor eval` does between parsing its options and printing
its tables, here so that a Python caller (or a test) runs the same eval with no CLI.

The engine cannot import the client (it sits above every layer), so `run_eval` takes what it
needs of one as a Protocol (`EvalClient`, which `ConductorClient` satisfies) and opens the trace
store through the factory it is given, after the batch has finished: an eval of thousands of
tasks holds no database connection while it waits. Progress goes to the caller's `on_progress`,
so the CLI draws its bar and a script may log or ignore it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from conductor_engine.engine.contracts.names import batch_workflow_id
from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.eval.report import SystemRow, rows_json, system_rows, write_report
from conductor_engine.engine.eval.suite_report import SuiteRow, suite_rows, write_suite_report
from conductor_engine.engine.eval.systems import EvalSpec, eval_tasks

if TYPE_CHECKING:
    from conductor_engine.engine.settings import Settings
    from conductor_engine.engine.storage.trace_store import TraceStore
    from conductor_engine.engine.tasks.suite import Suite

P_co = TypeVar("P_co", covariant=True)
P = TypeVar("P")

POLL_S = 0.5
"""How often the batch's progress is asked for while it runs."""
RUNNING = ("running", "continued_as_new")


class EvalClient(Protocol[P_co]):
    """What an eval needs of a Temporal client: start a batch of runs and ask how it goes
    (`ConductorClient` in runtime/client.py; P_co is its batch progress type)."""

    settings: Settings

    async def submit_batch(self, name: str, tasks: Sequence[Task], *, concurrency: int = ...,
                           report: bool = ...) -> tuple[str, bool]: ...

    async def batch_progress(self, name: str) -> tuple[str, P_co | None]: ...


@dataclass
class EvalOutcome:
    """A finished eval: one row per system, the suite's rows with a suite, the files written."""

    name: str
    tasks: int
    runs: int
    rows: list[SystemRow]
    suite_rows: list[SuiteRow] | None
    written: list[Path]


async def run_eval(
    client: EvalClient[P],
    open_store: Callable[[], AbstractAsyncContextManager[TraceStore]],
    name: str,
    tasks: Sequence[Task],
    spec: EvalSpec,
    *,
    out_dir: Path,
    suite: Suite | None = None,
    concurrency: int = 50,
    json_file: Path | None = None,
    on_submitted: Callable[[bool, int], None] | None = None,
    on_progress: Callable[[P], None] | None = None,
    poll_s: float = POLL_S,
) -> EvalOutcome:
    """Run every system of `spec` on `tasks` as batch `name` and write its report to `out_dir`
    (engine/eval/report.py; with a suite its paper-shaped table too, and the rows as JSON to
    `json_file`). Submitting an eval that ran before resumes it: only runs that did not
    complete run again. A worker must serve the client's queue while this waits.

    `on_submitted(started, runs)` is called once the batch is submitted (started False: it was
    running already); `on_progress(progress)` at each poll. LookupError (one line, with the
    batch's Temporal UI link) when the batch ends other than completed; ValueError from
    `submit_batch` for tasks that cannot be stored, before anything starts."""
    runs = eval_tasks(tasks, spec)
    _, started = await client.submit_batch(name, runs, concurrency=concurrency, report=False)
    if on_submitted is not None:
        on_submitted(started, len(runs))
    status = await wait_for_batch(client, name, on_progress, poll_s)
    if status != "completed":
        url = client.settings.workflow_url(batch_workflow_id(name))
        raise LookupError(f"batch {name} ended {status}; see {url}")
    async with open_store() as store:
        traces = await store.batch_traces(name, resolve_blobs=False)
    rows = system_rows(traces)
    written = write_report(name, rows, out_dir)
    by_suite = None
    if suite is not None:
        by_suite = suite_rows(suite, traces)
        written += write_suite_report(name, suite, by_suite, out_dir)
    if json_file is not None:
        json_file.write_text(json.dumps(rows_json(rows), indent=2) + "\n")
    return EvalOutcome(name=name, tasks=len(tasks), runs=len(runs), rows=rows,
                       suite_rows=by_suite, written=written)


async def wait_for_batch(client: EvalClient[P], name: str,
                         on_progress: Callable[[P], None] | None = None,
                         poll_s: float = POLL_S) -> str:
    """Poll the batch's progress until it stops running; its final status (`completed`,
    `failed`, `terminated`, ...). `on_progress` sees each answer of its progress query."""
    while True:
        status, progress = await client.batch_progress(name)
        if progress is not None and on_progress is not None:
            on_progress(progress)
        if status not in RUNNING:
            return status
        await asyncio.sleep(poll_s)
