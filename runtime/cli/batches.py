"""`conductor batch` (run, watch, report): many tasks from a file (`tasks check` is in
cli/tasks.py).

A batch is one BatchWorkflow; its live progress comes from the workflow's `progress` query and
its report from the traces it recorded."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markdown import Markdown
from rich.markup import escape
from rich.text import Text

from conductor_engine.engine.contracts.limits import MAX_CONCURRENCY
from conductor_engine.engine.contracts.names import batch_workflow_id
from conductor_engine.engine.settings import Settings
from conductor_engine.runtime.cli.app import (
    PoolOpt,
    app,
    err,
    fail,
    in_process_worker,
    load_pool,
    load_settings,
    load_task_file,
    open_trace_store,
    out,
    run_async,
)
from conductor_engine.runtime.cli.render import markdown_literal
from conductor_engine.runtime.client import ConductorClient

if TYPE_CHECKING:
    from rich.progress import ProgressColumn

    from conductor_engine.engine.contracts.batches import BatchProgress


@app.command()
def batch(
    source: Annotated[str, typer.Argument(
        help="a JSONL task file (or hf:NAME); or `watch` / `report` followed by the NAME")],
    batch_name: Annotated[str | None, typer.Argument(
        metavar="[NAME]", help="the batch, after `watch` or `report`")] = None,
    name: Annotated[str | None, typer.Option(help="batch name (default: the file's stem)")] = None,
    concurrency: Annotated[int, typer.Option(
        min=1, max=MAX_CONCURRENCY,
        help=f"most runs in flight at once, at most {MAX_CONCURRENCY}: each is a child "
             "workflow, and Temporal allows a workflow 2,000 pending children "
             "(limit.numPendingChildExecutions.error)")] = 50,
    watch: Annotated[bool, typer.Option(help="show live progress until it finishes")] = True,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", help="with `report`: where to write it (default batches/NAME)")] = None,
    pool: PoolOpt = None,
    worker: Annotated[bool | None, typer.Option(
        help="serve the batch from this process (default: yes on the embedded stack)")] = None,
) -> None:
    """Run every task of a file as one batch: `conductor batch tasks.jsonl --concurrency 50
    --name NAME`; re-attach with `conductor batch watch NAME`; rewrite the report with
    `conductor batch report NAME`. Submitting a finished batch again runs only the tasks that
    did not complete."""
    settings = load_settings(pool)
    if source in ("watch", "report"):
        if not batch_name:
            raise fail(f"`conductor batch {source}` needs the batch NAME")
        if source == "watch":
            run_async(_watch_batch(settings, batch_name, None))
        else:
            _report_batch(settings, batch_name, out_dir or Path("batches") / batch_name)
        return
    loaded = load_task_file(source)
    name = name or Path(source.split(":")[-1]).stem
    agents = load_pool(settings)

    async def go() -> None:
        conductor = await ConductorClient.connect(settings)
        in_process = settings.embedded if worker is None else worker
        async with in_process_worker(conductor, agents, in_process):
            wid, started = await conductor.submit_batch(name, loaded,
                                                        concurrency=concurrency)
            err.print(f"batch [bold]{escape(name)}[/] "
                      f"{'started' if started else 'already running'}: "
                      f"{len(loaded)} tasks, {concurrency} at a time · "
                      f"{escape(settings.workflow_url(wid))}", soft_wrap=True)
            if watch or in_process:
                await _watch_batch(settings, name, conductor)

    run_async(go())


def progress_columns() -> tuple[ProgressColumn, ...]:
    """The batch bar's columns, readable at 80 columns: the name cut to 24 characters, a short
    bar, the count and the time whole, and the figures in the room left, cut with `…` (never
    wrapped, never crowding out the count)."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.table import Column

    whole = Column(no_wrap=True)
    return (TextColumn("{task.description}", style="bold", markup=False,  # the name as written
                       table_column=Column(no_wrap=True, overflow="ellipsis", max_width=24)),
            BarColumn(bar_width=12), MofNCompleteColumn(table_column=whole),
            TimeElapsedColumn(table_column=Column(no_wrap=True)),
            TextColumn("{task.fields[info]}", markup=False,
                       table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis")))


def progress_info(p: BatchProgress) -> str:
    """The figures beside the bar, most wanted first: failures and reward."""
    reward = "—" if p.mean_reward is None else f"{p.mean_reward:.3f}"
    skipped = f" · skipped {p.skipped}" if p.skipped else ""
    return (f"failed {p.failed} · reward {reward} · running {p.running}{skipped} · "
            f"{p.input_tokens + p.output_tokens:,} tokens · ${p.cost_usd:.4f}")


async def _watch_batch(settings: Settings, name: str, conductor: ConductorClient | None) -> None:
    """A live progress bar from the batch's `progress` query, until it finishes."""
    from rich.progress import Progress

    conductor = conductor or await ConductorClient.connect(settings, start_embedded=False)
    with Progress(*progress_columns(), console=err, transient=False, expand=True) as bar:
        job = bar.add_task(name, total=None, info="")
        while True:
            status, p = await conductor.batch_progress(name)
            if p is not None:
                bar.update(job, total=p.total, completed=p.done, info=progress_info(p))
            if status != "running" and status != "continued_as_new":
                break
            await asyncio.sleep(0.5)
    if status != "completed":
        url = settings.workflow_url(batch_workflow_id(name))
        raise LookupError(f"batch {name} ended {status}; see {url}")
    if p is not None and p.report_dir:
        out.print(Text(f"report: {p.report_dir}"), soft_wrap=True)


def _report_batch(settings: Settings, name: str, out_dir: Path) -> None:
    """Write the batch's report from its recorded traces and print its summary."""
    from conductor_engine.engine.storage.batch_report import write_report

    async def go() -> dict[str, Any]:
        async with open_trace_store(settings) as store:
            traces = await store.batch_traces(name)
        if not traces:
            raise LookupError(f"no traces of batch {name!r} in the trace store")
        return write_report(name, traces, out_dir)

    summary = run_async(go())
    out.print(batch_summary(summary))
    out.print(Text(f"report: {out_dir.absolute()}"), soft_wrap=True)


def batch_summary(summary: dict[str, Any]) -> Markdown:
    """The report's summary as the terminal shows it: Markdown of ours, the batch's name (the
    user's text) as a literal, and links with their targets shown."""
    from conductor_engine.engine.storage.batch_report import summary_markdown

    literal = {**summary, "batch": markdown_literal(str(summary["batch"]))}
    return Markdown(summary_markdown(literal), hyperlinks=False)
