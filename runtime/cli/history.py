"""`conductor history`: a run's step trail from its Temporal history alone, for running and
failed runs too; printed round by round, as `traces show` prints a trace."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from conductor_engine.engine.text import shorten
from conductor_engine.runtime.cli.app import (
    app,
    fail,
    load_settings,
    out,
    run_async,
)
from conductor_engine.runtime.cli.render import (
    SHORT,
    Column,
    attempt_errors,
    reward_line,
    steps_table,
    trail_rows,
)
from conductor_engine.runtime.cli.traces import FullOpt, RunIdOpt
from conductor_engine.runtime.client import ConductorClient

if TYPE_CHECKING:
    from conductor_engine.runtime.history import Trail, TrailRound

TRAIL_COLUMNS: tuple[Column, ...] = ("round", "step", "agent", "subtask", "sees", "status",
                                     "output", "tokens", "cost", "attempts", "errors")


@app.command()
def history(
    workflow_id: str,
    run_id: RunIdOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="the trail as JSON")] = False,
    full: FullOpt = False,
) -> None:
    """A run's step trail from its Temporal history alone: what each agent was asked, the
    earlier steps it sees, what it answered, tokens, cost, attempts and errors. Works for
    running and failed runs too."""
    from conductor_engine.runtime.history import HistoryError, step_trail

    settings = load_settings()

    async def go() -> Trail:
        conductor = await ConductorClient.connect(settings)
        return await step_trail(conductor.client, workflow_id, run_id)

    try:
        trail = run_async(go())
    except HistoryError as e:
        raise fail(str(e)) from None
    if as_json:
        print(trail.model_dump_json(indent=2))
        return
    _print_trail(trail, limit=None if full else SHORT)
    out.print(Text(f"Temporal UI: {settings.workflow_url(trail.workflow_id, trail.run_id)}"),
              soft_wrap=True)


def _print_trail(trail: Trail, *, limit: int | None) -> None:
    engine_status = f" ({trail.run_status})" if trail.run_status not in (None, trail.status) \
        else ""
    out.print(f"[bold]{escape(trail.workflow_id)}[/] · run {escape(trail.run_id)} · "
              f"[bold]{escape(trail.status)}[/]{escape(engine_status)} · "
              f"{trail.usage.input_tokens}/{trail.usage.output_tokens} tokens"
              f" · ${trail.cost_usd:.4f} · {trail.events} events", soft_wrap=True)
    if trail.reset is not None:
        out.print(Text(f"resumed from run {trail.reset.base_run_id} (event "
                       f"{trail.reset.event_id}: {trail.reset.reason}); its failures: conductor "
                       f"history {trail.workflow_id} --run-id {trail.reset.base_run_id}"),
                  soft_wrap=True, highlight=False)
    if trail.task is not None:
        out.print(Text(f"task {trail.task.id}: {shorten(trail.task.question, limit)}"),
                  highlight=False, soft_wrap=True)
    for rnd in trail.rounds:
        _print_trail_round(rnd, limit)
    if trail.answer is not None:
        out.print(Panel(Text(shorten(trail.answer, limit)), title="answer",
                        title_align="left"))
    if trail.error:
        out.print(f"[red]error:[/] {escape(trail.error)}", soft_wrap=True)
    if trail.reward is not None:
        out.print(reward_line(trail.reward))
    for child in trail.self_calls:
        out.print(Text(f"└ self-call: conductor history {child}"), highlight=False,
                  soft_wrap=True)


def _print_trail_round(rnd: TrailRound, limit: int | None) -> None:
    for a in rnd.plan_attempts:
        if a.status != "done":
            verdict = f"[red]{escape(a.status)}[/]"
        elif a.plan is not None:
            verdict = f"plan ok ({len(a.plan)} steps)"
        else:
            verdict = f"[red]rejected: {escape(a.error or '')}[/]"
        out.print(f"round {rnd.index + 1} · plan attempt {a.attempt}: {verdict} · "
                  f"{a.usage.output_tokens} tokens · {a.attempts} call(s)", soft_wrap=True)
        if a.errors:
            out.print(escape(attempt_errors(a.errors)), soft_wrap=True, highlight=False)
    if rnd.steps:
        out.print(steps_table(trail_rows(rnd), TRAIL_COLUMNS, limit=limit))
