"""`conductor resume`: reset failed runs to just before their failed step, after showing what
is kept and what is redone. The planning and the reset itself live in runtime.resume;
this module orchestrates them for one run or a batch's failed runs, and asks first."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.text import Text

from conductor_engine.engine.settings import Settings
from conductor_engine.engine.text import shorten
from conductor_engine.runtime.cli.app import app, err, fail, load_settings, out, run_async
from conductor_engine.runtime.client import ConductorClient

if TYPE_CHECKING:
    from temporalio.client import Client

    from conductor_engine.runtime.resume import ResumePlan

Resumed = tuple[str, str | None, str | None]
"""(workflow id, new run id or None, why not)."""


@app.command("resume")
def resume_runs(
    workflow_id: Annotated[str | None, typer.Argument(help="the failed run's workflow id")] = None,
    batch: Annotated[str | None, typer.Option(help="resume every failed run of a batch")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="reset without asking")] = False,
) -> None:
    """Resume failed runs: reset each to just before its failed step. Steps that completed are
    kept (their agents are not called again); the failed step and the rest run anew. A worker
    must be serving the task queue (`conductor up`) for the resumed runs to proceed."""
    from conductor_engine.runtime.history import HistoryError
    from conductor_engine.runtime.resume import ResumeError

    if (workflow_id is None) == (batch is None):
        raise fail("give a workflow id or --batch NAME")
    settings = load_settings()
    try:
        resumed = run_async(_resume(settings, workflow_id, batch, yes))
    except (ResumeError, HistoryError) as e:
        raise fail(str(e)) from None
    for wid, run_id, problem in resumed:
        if run_id is None:
            err.print(Text.assemble(("error:", "bold red"), f" {problem or ''}"), soft_wrap=True)
            continue
        out.print(Text(f"resumed {wid}: new run {run_id} · {settings.workflow_url(wid, run_id)}"),
                  highlight=False, soft_wrap=True)
    if any(run_id is None for _, run_id, _ in resumed):
        raise typer.Exit(1)


async def _resume(
    settings: Settings, workflow_id: str | None, batch: str | None, yes: bool
) -> list[Resumed]:
    """Plan, show, confirm, reset: on one client and one event loop (a second client in a
    second loop can crash the interpreter as it exits)."""
    client = (await ConductorClient.connect(settings)).client
    plans = await _resume_plans(client, workflow_id, batch)
    if not plans:
        out.print(Text(f"no failed runs in batch {batch}"), highlight=False)
        return []
    for plan in plans:
        _print_resume_plan(plan)
    if not yes and not await asyncio.to_thread(typer.confirm, f"Reset {len(plans)} run(s)?"):
        raise typer.Abort()
    return await _reset_all(client, plans)


async def _resume_plans(
    client: Client, workflow_id: str | None, batch: str | None
) -> list[ResumePlan]:
    """One run's plan (its errors are the user's to see), or those of a batch's failed runs
    (a run that cannot be planned is reported and skipped)."""
    from conductor_engine.runtime.resume import ResumeError, failed_runs, plan_resume

    if workflow_id is not None:
        return [await plan_resume(client, workflow_id)]
    assert batch is not None
    plans = []
    for wid in await failed_runs(client, batch):
        try:
            plans.append(await plan_resume(client, wid))
        except ResumeError as e:
            err.print(f"[yellow]skipped:[/] {escape(str(e))}", soft_wrap=True)
    return plans


async def _reset_all(client: Client, plans: list[ResumePlan]) -> list[Resumed]:
    """Reset each planned run: one that cannot be reset (resumed meanwhile by someone else)
    does not stop the others."""
    from conductor_engine.runtime.resume import ResumeError, resume

    done: list[Resumed] = []
    for p in plans:
        try:
            done.append((p.workflow_id, await resume(client, p, reason="conductor resume"), None))
        except ResumeError as e:
            done.append((p.workflow_id, None, str(e)))
    return done


def _print_resume_plan(plan: ResumePlan) -> None:
    out.print(f"[bold]{escape(plan.workflow_id)}[/] · run {escape(plan.run_id)} · "
              f"[bold]{escape(plan.status)}[/]"
              + (f": {escape(plan.error)}" if plan.error else ""), soft_wrap=True)
    where = f"just before {plan.failed.label()}" if plan.failed else "after its last progress"
    out.print(Text(f"reset to event {plan.reset_event_id} ({where})"), highlight=False)
    out.print("kept (not called again):" if plan.kept else "kept: nothing")
    for i in plan.kept:
        out.print(Text(f"  {i.label()}" + (f" · {shorten(i.subtask, 80)}" if i.subtask
                                           else "")), highlight=False, soft_wrap=True)
    out.print("redone:")
    for i in plan.redone:
        out.print(Text(f"  {i.label()} · {i.why or ''}"), highlight=False, soft_wrap=True)
    for note in plan.notes:
        out.print(f"note: {escape(note)}", highlight=False, soft_wrap=True)
    out.print(f"same with Temporal's CLI: {escape(plan.command)}", highlight=False,
              soft_wrap=True)
