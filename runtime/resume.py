"""Resume a failed run: reset its workflow to just before the failed step.

A Temporal reset starts a new run of the same workflow id from a copy of the old run's history
up to a chosen WorkflowTaskCompleted event. The worker replays that copy: every step that
completed before the point gets its recorded result back, and no agent is called again for it;
the workflow then goes on from there, so the failed step and everything after it run anew. This
is what the Temporal UI's "Reset" and `temporal workflow reset --event-id N` do; this module
chooses N and says beforehand what will be kept and what redone.

Choosing the point. The failed step's activity was scheduled by some WorkflowTaskCompleted event
S; any workflow task completed after S but before the failed step's last attempt started is
also a valid point, and a later one keeps more: a parallel step that finished while the failed
step was still retrying is kept only if the point is after its completion. So the point is the
last WorkflowTaskCompleted before the failed activity's last attempt started (it is S itself
when nothing else happened meanwhile). At that point the failed step is scheduled but not
started (Temporal writes an activity's started event only when it closes), and the server
schedules such activities again on reset, with fresh attempts. Steps whose results came after
the point, parallel ones included, are redone: the plan lists them. A self-call child still open
at the point would be left dangling, so the point moves back to before any such child started.
"""

from __future__ import annotations

import asyncio
import shlex
import uuid
from typing import Literal

from pydantic import BaseModel, Field
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from conductor_engine.engine.contracts.names import CONDUCT_WORKFLOW
from conductor_engine.engine.contracts.search_attributes import BATCH
from conductor_engine.runtime.history import (
    ExecutionStatus,
    RunEvents,
    StepStatus,
    Trail,
    TrailPlanAttempt,
    TrailStep,
    load_trail,
)

RESUMABLE: frozenset[str] = frozenset({"failed", "terminated", "timed_out"})


class ResumeError(RuntimeError):
    """The run cannot be resumed; the message says why (one line)."""


class ResumeItem(BaseModel):
    """A plan attempt or a step, and (when redone) why."""

    kind: Literal["plan", "step"]
    round: int
    index: int = Field(description="the step's 0-based index, or the plan attempt's number")
    agent: str
    subtask: str = ""
    status: StepStatus = Field(description="what it was in the run being resumed")
    why: str | None = Field(default=None, description="why it runs again; None when kept")
    child_workflow_id: str | None = None

    def label(self) -> str:
        if self.kind == "plan":
            return f"round {self.round + 1} · plan attempt {self.index}"
        return f"round {self.round + 1} · step {self.index + 1} ({self.agent})"


class ResumePlan(BaseModel):
    workflow_id: str
    run_id: str
    namespace: str
    status: ExecutionStatus
    error: str | None = None
    failed: ResumeItem | None = Field(
        default=None, description="the step (or plan attempt) whose failure ended the run")
    reset_event_id: int = Field(description="the WorkflowTaskCompleted event to reset to")
    kept: list[ResumeItem] = Field(default_factory=list)
    redone: list[ResumeItem] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    @property
    def command(self) -> str:
        """The same reset with Temporal's own CLI."""
        return shlex.join([
            "temporal", "workflow", "reset", "--namespace", self.namespace,
            "--workflow-id", self.workflow_id, "--run-id", self.run_id,
            "--event-id", str(self.reset_event_id), "--reason", "resume",
        ])


# --- planning -------------------------------------------------------------------------------


def _not_resumable(trail: Trail) -> str:
    run = f"run {trail.workflow_id}"
    if trail.status == "running":
        return f"{run} is still running; nothing to resume"
    if trail.status == "cancelled":
        return f"{run} was cancelled; nothing to resume (submit it again to rerun it)"
    return f"{run} is {trail.status.replace('_', ' ')}; nothing to resume"


Entry = TrailPlanAttempt | TrailStep


def _entries(trail: Trail) -> list[Entry]:
    out: list[Entry] = []
    for rnd in trail.rounds:
        out += rnd.plan_attempts
        out += rnd.steps
    return out


def _item(entry: Entry, why: str | None) -> ResumeItem:
    if isinstance(entry, TrailPlanAttempt):
        return ResumeItem(kind="plan", round=entry.round, index=entry.attempt,
                          agent=entry.conductor_id or "conductor", status=entry.status, why=why)
    return ResumeItem(kind="step", round=entry.round, index=entry.index, agent=entry.agent,
                      subtask=entry.subtask, status=entry.status, why=why,
                      child_workflow_id=entry.child_workflow_id)


def _failed_entry(trail: Trail) -> Entry | None:
    """The first step or plan attempt to fail for good: the workflow fails on the first one
    (and cancels the rest), so it is the one its error names."""
    failed = [e for e in _entries(trail) if e.status == "failed" and e.closed_event_id]
    return min(failed, key=lambda e: e.closed_event_id or 0) if failed else None


def _bound(failed: Entry | None, events: RunEvents) -> int:
    """The reset point must come before this event."""
    if failed is None:  # terminated, timed out: keep all that completed
        assert events.closed is not None
        return events.closed.event_id
    if isinstance(failed, TrailStep) and failed.child_workflow_id and not failed.started_event_id:
        return failed.scheduled_event_id or 0  # a failed self-call: start the child again
    return failed.started_event_id or failed.closed_event_id or 0


def reset_point(events: RunEvents, bound: int) -> int:
    """The last WorkflowTaskCompleted before `bound`, moved back before any self-call child
    that was still open there (a reset cannot take a running child along)."""
    candidates = [i for i in events.workflow_task_completed if i < bound]
    if not candidates:
        raise ResumeError("the run never completed a workflow task; submit it again instead")
    point = max(candidates)
    moved = True
    while moved:
        moved = False
        for child in events.children.values():
            closed = child.closed.event_id if child.closed else None
            if child.initiated.event_id < point and (closed is None or closed > point):
                point = (child.initiated.start_child_workflow_execution_initiated_event_attributes
                         .workflow_task_completed_event_id)
                moved = True
    return point


def _why(entry: Entry, point: int, failed: Entry | None, trail: Trail) -> str | None:
    """None when the entry's result is kept; else why it runs again."""
    if entry is failed:
        return f"failed: {entry.errors[-1].message}" if entry.errors else "failed"
    if entry.status == "done":
        if entry.closed_event_id is not None and entry.closed_event_id < point:
            return None
        return "finished after the reset point"
    ended = "failed" if trail.status == "failed" else "ended"
    return {
        "failed": "failed as well",
        "cancelled": f"cancelled when the run {ended}",
        "running": f"was running when the run {ended}",
        "pending": "not run yet",
    }[entry.status]


def _notes(plan: ResumePlan, trail: Trail) -> list[str]:
    notes = []
    after = [i for i in plan.redone if i.why == "finished after the reset point"]
    if after:
        notes.append(f"{len(after)} step(s) finished only after the reset point (in parallel "
                     "with the failed one or later) and are called again")
    if trail.status == "timed_out":
        notes.append("the run hit its workflow execution timeout; the resumed run keeps the "
                     "same deadline")
    notes.append("scoring and recording run again: the resumed run writes its own trace (same "
                 "workflow id, new run id); the failed run's trace stays")
    return notes


async def plan_resume(client: Client, workflow_id: str) -> ResumePlan:
    """What resuming the latest run of `workflow_id` would keep and redo, and where it resets.
    Raises ResumeError for a run that is not failed, terminated or timed out."""
    trail, events = await load_trail(client, workflow_id)
    if trail.status not in RESUMABLE:
        raise ResumeError(_not_resumable(trail))
    failed = _failed_entry(trail) if trail.status == "failed" else None
    point = reset_point(events, _bound(failed, events))
    plan = ResumePlan(workflow_id=workflow_id, run_id=trail.run_id, namespace=client.namespace,
                      status=trail.status, error=trail.error, reset_event_id=point)
    for entry in _entries(trail):
        why = _why(entry, point, failed, trail)
        item = _item(entry, why)
        (plan.kept if why is None else plan.redone).append(item)
        if entry is failed:
            plan.failed = item
    plan.notes = _notes(plan, trail)
    return plan


# --- resetting ------------------------------------------------------------------------------


async def resume(client: Client, plan: ResumePlan, reason: str = "resumed by conductor") -> str:
    """Reset the run at the plan's point; returns the new run id. Refuses when the workflow
    has had a newer run since the plan was made (resetting an old run would end the new one)."""
    try:
        current = (await client.get_workflow_handle(plan.workflow_id).describe()).run_id
    except RPCError as e:
        raise ResumeError(f"cannot read run {plan.workflow_id!r}: {e.message}") from e
    if current != plan.run_id:
        raise ResumeError(f"run {plan.workflow_id} has a newer run ({current}) than the one "
                          f"planned ({plan.run_id}); already resumed?")
    request = ResetWorkflowExecutionRequest(
        namespace=client.namespace,
        workflow_execution=WorkflowExecution(workflow_id=plan.workflow_id, run_id=plan.run_id),
        reason=reason,
        workflow_task_finish_event_id=plan.reset_event_id,
        request_id=str(uuid.uuid4()),
        identity=client.identity,
    )
    try:
        response = await client.workflow_service.reset_workflow_execution(request)
    except RPCError as e:
        raise ResumeError(f"Temporal refused to reset {plan.workflow_id}: {e.message}") from e
    return response.run_id


async def failed_runs(client: Client, batch: str) -> list[str]:
    """Workflow ids of the batch's runs whose latest run failed. Visibility lists every run,
    so a run that failed and was resumed since is listed too; its latest run decides."""
    if '"' in batch or "\\" in batch:
        raise ResumeError(f"invalid batch name {batch!r}")
    query = (f'WorkflowType = "{CONDUCT_WORKFLOW}" AND {BATCH.name} = "{batch}" '
             'AND ExecutionStatus = "Failed"')
    ids: list[str] = []
    async for wf in client.list_workflows(query):
        if wf.id not in ids:
            ids.append(wf.id)
    latest = await asyncio.gather(*(client.get_workflow_handle(w).describe() for w in ids))
    return [d.id for d in latest if d.status == WorkflowExecutionStatus.FAILED]
