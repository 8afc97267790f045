"""`conductor traces list|show`: recorded traces, from PostgreSQL.

A trace prints round by round, as `conductor history` (cli/history.py) prints a trail: its plan
attempts, then its steps through the one step table of render.py."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from conductor_engine.engine.contracts.traces import Trace
from conductor_engine.engine.storage.trace_store import TraceFilter, TraceSummary
from conductor_engine.engine.text import shorten
from conductor_engine.runtime.cli.app import (
    fail,
    load_settings,
    open_trace_store,
    out,
    run_async,
    traces_app,
)
from conductor_engine.runtime.cli.render import (
    SHORT,
    Column,
    Fitted,
    record_rows,
    reward_line,
    steps_table,
)

TRACE_COLUMNS: tuple[Column, ...] = ("step", "agent", "subtask", "sees", "output", "tokens",
                                     "seconds", "attempts")
REWARD_BOUND = 1e6
"""Rewards are weights of the user's choosing (RewardWeights, any float); a filter beyond
this bound keeps out only inf, which no reward is."""
MAX_ROWS = 100_000
"""Most rows `traces list` prints: a bound on memory, far above what a terminal shows."""
FullOpt = Annotated[bool, typer.Option(help="print outputs in full, not cut")]
RunIdOpt = Annotated[str | None, typer.Option(help="a run other than the latest")]


@traces_app.command("list")
def traces_list(
    dataset: Annotated[str | None, typer.Option(help="only this dataset")] = None,
    tag: Annotated[str | None, typer.Option(help="only tasks with this tag")] = None,
    task: Annotated[str | None, typer.Option("--task", help="only this task id")] = None,
    policy: Annotated[str | None, typer.Option(help="only this policy (conductor id)")] = None,
    version: Annotated[str | None, typer.Option(help="only this policy version")] = None,
    status: Annotated[str | None, typer.Option(
        help="completed, invalid_plan, failed or cancelled")] = None,
    min_reward: Annotated[float | None, typer.Option(
        help="reward at least this", min=-REWARD_BOUND, max=REWARD_BOUND)] = None,
    max_reward: Annotated[float | None, typer.Option(
        help="reward at most this", min=-REWARD_BOUND, max=REWARD_BOUND)] = None,
    since: Annotated[datetime | None, typer.Option(help="finished at or after (ISO date)")] = None,
    self_calls: Annotated[bool, typer.Option(help="include self-call traces")] = False,
    limit: Annotated[int, typer.Option(help="most rows", min=1, max=MAX_ROWS)] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines, one trace each")] = False,
) -> None:
    """List recorded traces, newest first."""
    try:  # a date at either end of the calendar has no UTC time in a zone east or west of it
        since_utc = since.astimezone(UTC) if since else None
    except (ValueError, OverflowError):
        raise typer.BadParameter(f"{since} is out of range in UTC", param_hint="'--since'"
                                 ) from None
    settings = load_settings()
    filters = TraceFilter(
        dataset=dataset, tag=tag, task_id=task, policy_name=policy, policy_version=version,
        status=status, min_reward=min_reward, max_reward=max_reward, since=since_utc,
        roots_only=not self_calls,
    )

    async def go() -> list[TraceSummary]:
        async with open_trace_store(settings) as store:
            return await store.search(filters, limit=limit)

    rows = run_async(go())
    if as_json:
        for r in rows:
            print(r.model_dump_json())
        return
    out.print(traces_table(rows))


TRACE_HEADERS = ("finished", "workflow", "task", "dataset", "policy", "status", "reward",
                 "tokens", "cost $", "s", "question")
TRACES_DROP = ("cost $", "s", "dataset", "tokens", "policy", "task", "finished")
"""What `traces list` leaves out first on a narrow terminal: the workflow id (what to show
next), status, reward and question stay."""


def traces_table(rows: list[TraceSummary]) -> Fitted:
    """`traces list`'s table: every cell plain text (ids, datasets and questions are user
    text), fitted to the terminal (render.Fitted)."""
    cells = [[
        r.finished_at.astimezone().strftime("%Y-%m-%d %H:%M:%S"), r.workflow_id, r.task_id,
        r.dataset or "", f"{r.policy.name}@{r.policy.version}", r.status,
        "" if r.reward is None else f"{r.reward:g}", str(r.input_tokens + r.output_tokens),
        f"{r.cost_usd:.4f}", f"{r.seconds:.1f}", shorten(r.question, 60),
    ] for r in rows]
    return Fitted(f"{len(rows)} trace(s)", TRACE_HEADERS, cells, drop=TRACES_DROP,
                  text=("question",))


@traces_app.command("show")
def traces_show(
    workflow_id: str,
    run_id: RunIdOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="the whole trace as JSON")] = False,
    full: FullOpt = False,
) -> None:
    """Show one trace whole: plan attempts, steps, self-calls, answer and reward."""
    settings = load_settings()

    async def go() -> Trace | None:
        async with open_trace_store(settings) as store:
            return await store.get(workflow_id, run_id)

    trace = run_async(go())
    if trace is None:
        raise fail(f"no trace of {workflow_id!r}: the run may still be going "
                   f"(`conductor status {workflow_id}`) or was recorded to another database")
    if as_json:
        print(trace.model_dump_json(indent=2))
        return
    _print_trace(trace, limit=None if full else SHORT)
    out.print(Text(f"Temporal UI: {settings.workflow_url(trace.workflow_id, trace.run_id)}"),
              soft_wrap=True)


def _print_trace(trace: Trace, *, limit: int | None, indent: str = "") -> None:
    """The trace, then each self-call's trace indented beneath it."""
    t = trace.totals
    out.print(
        f"{indent}[bold]{escape(trace.workflow_id)}[/] · run {escape(trace.run_id)} · "
        f"{escape(trace.policy.name)}@{escape(trace.policy.version)} · "
        f"[bold]{escape(trace.status)}[/] · "
        f"{t.usage.input_tokens}/{t.usage.output_tokens} tokens · ${t.cost_usd:.4f} · "
        f"{t.seconds:.1f}s · {trace.finished_at.astimezone():%Y-%m-%d %H:%M:%S}",
        soft_wrap=True,
    )
    task = trace.task
    where = (f" · dataset {task.dataset}" if task.dataset else "") + (
        f" · tags {', '.join(task.tags)}" if task.tags else "")
    out.print(Text(f"{indent}task {task.id}{where}: {shorten(task.question, limit)}"),
              highlight=False, soft_wrap=True)
    for rnd in trace.rounds:
        for a in rnd.attempts:
            verdict = "plan ok" if a.plan is not None else f"[red]{escape(a.error or '')}[/]"
            lp = "with logprobs" if a.logprobs is not None else "no logprobs"
            out.print(f"{indent}round {rnd.index + 1} · plan attempt {a.attempt}: {verdict} · "
                      f"{a.usage.output_tokens} tokens, {lp}", soft_wrap=True)
        if rnd.steps:
            out.print(steps_table(record_rows(rnd), TRACE_COLUMNS, limit=limit))
    if trace.answer is not None:
        out.print(Panel(Text(shorten(trace.answer, limit)), title="answer",
                        title_align="left"))
    if trace.error:
        out.print(f"{indent}[red]error:[/] {escape(trace.error)}", soft_wrap=True)
    if trace.reward is not None:
        out.print(Text.assemble(indent, reward_line(trace.reward)))
    for child in trace.children:
        out.print(Text(f"{indent}└ self-call:"))
        _print_trace(child, limit=limit, indent=indent + "  ")
