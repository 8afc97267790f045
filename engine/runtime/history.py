"""A run's audit trail, read from its Temporal history alone.

The trace store answers "what happened" for finished runs that reached their record activity.
History answers it for every run, also a running one, one that failed before it could be
recorded, or one whose trace database is gone: every activity's input and result is in it. So
`step_trail` rebuilds, from the events and nothing else, what each step was asked, what it could
see, what it answered, what it cost, and how each attempt failed. Payloads go through the
client's data converter, which also fetches the payloads that were kept in the blob store.

What history cannot say: Temporal writes an activity's attempts as one started event (carrying
the final attempt number and the failure of the attempt before it) and one closing event. So a
step that failed three times and then succeeded shows attempts 3 and the error of attempt 2;
the error of attempt 1 is not in history (the worker's log has it). While an activity is still
retrying, the server's pending-activity record gives its attempt and last failure, and the trail
includes them.

It reads the activities' input models and names from engine/contracts, not the activities.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflow.v1 import PendingActivityInfo
from temporalio.client import Client, WorkflowHistory
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError, FailureError, TimeoutError
from temporalio.service import RPCError

from conductor_engine.engine.contracts.activities import (
    AgentCallInput,
    PlanRequest,
    RecordRequest,
)
from conductor_engine.engine.contracts.names import (
    AGENT_ACTIVITY,
    PLAN_ACTIVITY,
    RECORD_ACTIVITY,
    SCORE_ACTIVITY,
    parse_self_call_id,
)
from conductor_engine.engine.contracts.records import AgentReply, PlanAttempt, RunResult
from conductor_engine.engine.plan.language import Access, Plan
from conductor_engine.engine.providers.base import Usage
from conductor_engine.engine.rewards import Reward
from conductor_engine.engine.tasks.model import Task, VisibleStep

ExecutionStatus = Literal[
    "running", "completed", "failed", "cancelled", "terminated", "timed_out", "continued_as_new"
]
StepStatus = Literal["pending", "running", "done", "failed", "cancelled"]

_CLOSE = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED: "completed",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED: "failed",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED: "cancelled",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED: "terminated",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT: "timed_out",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW: "continued_as_new",
}


class HistoryError(RuntimeError):
    """A run's history cannot be read (no such run, or a payload that cannot be decoded)."""


# --- the trail ------------------------------------------------------------------------------


class AttemptError(BaseModel):
    """How one attempt of an activity (or a self-call child) failed."""

    attempt: int | None = Field(description="the attempt number, None where history omits it")
    message: str
    type: str | None = Field(default=None, description="the error's type, or the timeout kind")
    non_retryable: bool = False


class TrailStep(BaseModel):
    round: int
    index: int = Field(description="0-based, as in plans and traces")
    agent: str
    subtask: str
    question: str = Field(default="", description="the task's question, as the agent got it")
    access: Access | None = None
    saw: list[int] = Field(default_factory=list)
    visible: list[VisibleStep] = Field(
        default_factory=list, description="the earlier steps the agent was shown, with outputs"
    )
    status: StepStatus = "pending"
    output: str | None = None
    model: str = ""
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float = 0.0
    seconds: float = Field(default=0.0, description="scheduled to closed, all attempts")
    attempts: int = 0
    errors: list[AttemptError] = Field(default_factory=list)
    child_workflow_id: str | None = None
    scheduled_event_id: int | None = None
    scheduled_by_event_id: int | None = Field(
        default=None, description="the WorkflowTaskCompleted event whose commands scheduled it"
    )
    started_event_id: int | None = None
    closed_event_id: int | None = None

    @property
    def number(self) -> str:
        return f"{self.index + 1}"


class TrailPlanAttempt(BaseModel):
    round: int
    attempt: int
    status: StepStatus = "running"
    raw_text: str | None = None
    plan: Plan | None = None
    error: str | None = Field(default=None, description="why the plan was rejected")
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float = 0.0
    conductor_id: str = ""
    policy_version: str = ""
    attempts: int = Field(default=0, description="activity attempts (calls of the conductor)")
    errors: list[AttemptError] = Field(default_factory=list)
    scheduled_event_id: int | None = None
    scheduled_by_event_id: int | None = None
    started_event_id: int | None = None
    closed_event_id: int | None = None


class TrailRound(BaseModel):
    index: int
    plan_attempts: list[TrailPlanAttempt] = Field(default_factory=list)
    plan: Plan | None = None
    steps: list[TrailStep] = Field(default_factory=list)


class ResetRecord(BaseModel):
    """This run began as a reset of another run (a resume)."""

    base_run_id: str
    event_id: int = Field(description="the WorkflowTaskFailed event that marks the reset")
    reason: str


class Trail(BaseModel):
    """Everything history says about one run, step by step."""

    workflow_id: str
    run_id: str
    status: ExecutionStatus
    task: Task | None = None
    run_status: str | None = Field(
        default=None, description="the engine's status: completed, invalid_plan, failed, ..."
    )
    answer: str | None = None
    error: str | None = None
    reward: Reward | None = None
    rounds: list[TrailRound] = Field(default_factory=list)
    self_calls: list[str] = Field(default_factory=list, description="child workflow ids")
    reset: ResetRecord | None = None
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float = 0.0
    started_at: datetime | None = None
    closed_at: datetime | None = None
    events: int = 0

    @property
    def steps(self) -> list[TrailStep]:
        return [s for r in self.rounds for s in r.steps]

    @property
    def plan_attempts(self) -> list[TrailPlanAttempt]:
        return [a for r in self.rounds for a in r.plan_attempts]


# --- reading history ------------------------------------------------------------------------


@dataclass
class ActivityEvents:
    """One scheduled activity and what became of it, before decoding."""

    type: str
    activity_id: str
    scheduled: HistoryEvent
    started: HistoryEvent | None = None
    closed: HistoryEvent | None = None
    cancel_requested: bool = False
    pending: PendingActivityInfo | None = None


@dataclass
class ChildEvents:
    workflow_id: str
    initiated: HistoryEvent
    closed: HistoryEvent | None = None


@dataclass
class RunEvents:
    """The events that matter, grouped by what they belong to."""

    started: HistoryEvent | None = None
    closed: HistoryEvent | None = None
    reset: HistoryEvent | None = None
    activities: dict[int, ActivityEvents] = field(default_factory=dict)
    children: dict[int, ChildEvents] = field(default_factory=dict)
    workflow_task_completed: list[int] = field(default_factory=list)
    count: int = 0


def _activity_event_owner(event: HistoryEvent) -> tuple[str, int] | None:
    """(role, scheduled event id) for an activity event that closes or starts an activity."""
    for role, attr in (
        ("started", "activity_task_started_event_attributes"),
        ("closed", "activity_task_completed_event_attributes"),
        ("closed", "activity_task_failed_event_attributes"),
        ("closed", "activity_task_timed_out_event_attributes"),
        ("closed", "activity_task_canceled_event_attributes"),
        ("cancel", "activity_task_cancel_requested_event_attributes"),
    ):
        if event.HasField(attr):  # type: ignore[arg-type]
            return role, getattr(event, attr).scheduled_event_id
    return None


_CHILD_CLOSE_ATTRS = (
    "child_workflow_execution_completed_event_attributes",
    "child_workflow_execution_failed_event_attributes",
    "child_workflow_execution_timed_out_event_attributes",
    "child_workflow_execution_canceled_event_attributes",
    "child_workflow_execution_terminated_event_attributes",
    "start_child_workflow_execution_failed_event_attributes",
)


def group_events(events: Sequence[HistoryEvent]) -> RunEvents:
    out = RunEvents(count=len(events))
    for e in events:
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            out.started = e
        elif e.event_type in _CLOSE:
            out.closed = e
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            out.workflow_task_completed.append(e.event_id)
        elif (e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
              and e.workflow_task_failed_event_attributes.cause
              == WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_WORKFLOW):
            out.reset = e
        elif e.HasField("activity_task_scheduled_event_attributes"):
            a = e.activity_task_scheduled_event_attributes
            out.activities[e.event_id] = ActivityEvents(a.activity_type.name, a.activity_id, e)
        elif e.HasField("start_child_workflow_execution_initiated_event_attributes"):
            c = e.start_child_workflow_execution_initiated_event_attributes
            out.children[e.event_id] = ChildEvents(c.workflow_id, e)
        elif (owner := _activity_event_owner(e)) is not None:
            role, scheduled_id = owner
            act = out.activities.get(scheduled_id)
            if act is None:
                continue
            if role == "started":
                act.started = e
            elif role == "closed":
                act.closed = e
            else:
                act.cancel_requested = True
        else:
            for attr in _CHILD_CLOSE_ATTRS:
                if e.HasField(attr):  # type: ignore[arg-type]
                    child = out.children.get(getattr(e, attr).initiated_event_id)
                    if child is not None:
                        child.closed = e
    return out


async def fetch_events(
    client: Client, workflow_id: str, run_id: str | None = None
) -> tuple[str, RunEvents]:
    """The run's grouped events and its run id (the latest run unless one is given). The run
    is described first, so a resume that starts a new run meanwhile cannot mix two runs; for a
    running workflow the description also gives its activities' current attempts."""
    try:
        desc = await client.get_workflow_handle(workflow_id, run_id=run_id).describe()
        history: WorkflowHistory = await client.get_workflow_handle(
            workflow_id, run_id=desc.run_id).fetch_history()
    except RPCError as e:
        raise HistoryError(f"no run {workflow_id!r}"
                           + (f" with run id {run_id}" if run_id else "")
                           + f" in namespace {client.namespace}: {e.message}") from e
    events = group_events(history.events)
    if events.closed is None:
        by_id = {a.activity_id: a for a in events.activities.values()}
        for pending in desc.raw_description.pending_activities:
            if (act := by_id.get(pending.activity_id)) is not None:
                act.pending = pending
    return desc.run_id, events


# --- decoding -------------------------------------------------------------------------------


async def _decode(dc: DataConverter, payloads: Any, type_: type[Any], what: str) -> Any:
    try:
        values = await dc.decode_wrapper(payloads, [type_])
    except Exception as e:  # a missing blob, a payload from another engine version
        raise HistoryError(f"cannot decode {what}: {e}") from e
    return values[0] if values else None


async def _failure(dc: DataConverter, failure: Failure, attempt: int | None) -> AttemptError:
    """One attempt's error in words, as the workflow's `_cause` would say it."""
    exc = await dc.decode_failure(failure)
    if isinstance(exc, TimeoutError):
        kind = exc.type.name.lower().replace("_", "-") if exc.type else "timeout"
        cause: BaseException | None = exc.cause
        while isinstance(cause, FailureError) and cause.cause is not None:
            cause = cause.cause
        reason = f": {getattr(cause, 'message', cause)}" if cause is not None else ""
        return AttemptError(attempt=attempt, message=f"timed out ({kind}){reason}",
                            type=f"timeout ({kind})")
    message = getattr(exc, "message", None) or str(exc)
    if isinstance(exc, ApplicationError):
        return AttemptError(attempt=attempt, message=message, type=exc.type,
                            non_retryable=exc.non_retryable)
    return AttemptError(attempt=attempt, message=message, type=type(exc).__name__)


def _seconds(start: HistoryEvent, end: HistoryEvent | None) -> float:
    if end is None:
        return 0.0
    return (end.event_time.ToDatetime() - start.event_time.ToDatetime()).total_seconds()


@dataclass
class _Outcome:
    """What became of one activity: status, attempts, errors, and its decoded result."""

    status: StepStatus
    attempts: int
    errors: list[AttemptError]
    result: Any = None


async def _outcome(dc: DataConverter, act: ActivityEvents, result_type: type[Any]) -> _Outcome:
    attempts, errors = 0, []
    if act.started is not None:
        started = act.started.activity_task_started_event_attributes
        attempts = started.attempt
        if started.HasField("last_failure"):
            errors.append(await _failure(dc, started.last_failure, attempts - 1))
    elif act.pending is not None:
        attempts = act.pending.attempt
        if act.pending.HasField("last_failure"):
            errors.append(await _failure(dc, act.pending.last_failure, attempts - 1))
    closed = act.closed
    if closed is None:  # running, or in flight when the run was terminated or timed out
        return _Outcome("cancelled" if act.cancel_requested else "running", attempts, errors)
    if closed.HasField("activity_task_completed_event_attributes"):
        result = await _decode(dc, closed.activity_task_completed_event_attributes.result,
                               result_type, f"the result of {act.type} (event {closed.event_id})")
        return _Outcome("done", attempts, errors, result)
    if closed.HasField("activity_task_canceled_event_attributes"):
        return _Outcome("cancelled", attempts, errors)
    attrs = (closed.activity_task_failed_event_attributes
             if closed.HasField("activity_task_failed_event_attributes")
             else closed.activity_task_timed_out_event_attributes)
    errors.append(await _failure(dc, attrs.failure, attempts or None))
    return _Outcome("failed", attempts, errors)


def _event_ids(act: ActivityEvents) -> dict[str, int | None]:
    return {
        "scheduled_event_id": act.scheduled.event_id,
        "scheduled_by_event_id":
            act.scheduled.activity_task_scheduled_event_attributes.workflow_task_completed_event_id,
        "started_event_id": act.started.event_id if act.started else None,
        "closed_event_id": act.closed.event_id if act.closed else None,
    }


# --- building the trail ---------------------------------------------------------------------


class _Builder:
    def __init__(self, dc: DataConverter, workflow_id: str, run_id: str, events: RunEvents) -> None:
        self.dc, self.events = dc, events
        self.rounds: dict[int, TrailRound] = {}
        self.reward: Reward | None = None
        self.recorded: RecordRequest | None = None
        self.trail = Trail(workflow_id=workflow_id, run_id=run_id, status="running",
                           events=events.count)

    def round(self, index: int) -> TrailRound:
        return self.rounds.setdefault(index, TrailRound(index=index))

    def step(self, rnd: int, index: int) -> TrailStep:
        steps = self.round(rnd).steps
        for s in steps:
            if s.index == index:
                return s
        step = TrailStep(round=rnd, index=index, agent="", subtask="")
        steps.append(step)
        return step

    async def build(self) -> Trail:
        await self._workflow_start()
        for act in sorted(self.events.activities.values(), key=lambda a: a.scheduled.event_id):
            await self._activity(act)
        for child in self.events.children.values():
            await self._child(child)
        await self._workflow_close()
        self._finish()
        return self.trail

    async def _workflow_start(self) -> None:
        ev = self.events.started
        if ev is None:
            return
        self.trail.started_at = ev.event_time.ToDatetime(tzinfo=UTC)
        self.trail.task = await _decode(
            self.dc, ev.workflow_execution_started_event_attributes.input, Task, "the task")
        if (reset := self.events.reset) is not None:
            attrs = reset.workflow_task_failed_event_attributes
            self.trail.reset = ResetRecord(base_run_id=attrs.base_run_id, event_id=reset.event_id,
                                           reason=attrs.failure.message)

    async def _activity(self, act: ActivityEvents) -> None:
        if act.type == PLAN_ACTIVITY:
            await self._plan_attempt(act)
        elif act.type == AGENT_ACTIVITY:
            await self._agent_call(act)
        elif act.type == SCORE_ACTIVITY:
            out = await _outcome(self.dc, act, Reward)
            self.reward = out.result or self.reward
        elif act.type == RECORD_ACTIVITY:
            self.recorded = await _decode(
                self.dc, act.scheduled.activity_task_scheduled_event_attributes.input,
                RecordRequest, f"the {RECORD_ACTIVITY} input")

    async def _plan_attempt(self, act: ActivityEvents) -> None:
        req: PlanRequest = await _decode(
            self.dc, act.scheduled.activity_task_scheduled_event_attributes.input, PlanRequest,
            f"the {PLAN_ACTIVITY} input (event {act.scheduled.event_id})")
        out = await _outcome(self.dc, act, PlanAttempt)
        rec = TrailPlanAttempt(round=req.round, attempt=req.attempt, status=out.status,
                               attempts=out.attempts, errors=out.errors, **_event_ids(act))
        res: PlanAttempt | None = out.result
        if res is not None:
            rec.raw_text, rec.plan, rec.error = res.raw_text, res.plan, res.error
            rec.usage, rec.cost_usd = res.usage, res.cost_usd
            rec.conductor_id, rec.policy_version = res.conductor_id, res.policy_version
        rnd = self.round(req.round)
        rnd.plan_attempts.append(rec)
        if res is not None and res.plan is not None:
            self._planned(rnd, res.plan)

    def _planned(self, rnd: TrailRound, plan: Plan) -> None:
        """The round's plan: every step listed, also those that never ran."""
        rnd.plan = plan
        for i, s in enumerate(plan.steps):
            step = self.step(rnd.index, i)
            step.agent, step.subtask, step.access = s.agent, s.subtask, s.access
            if not step.visible:
                step.saw = s.sees(i)

    async def _agent_call(self, act: ActivityEvents) -> None:
        req: AgentCallInput = await _decode(
            self.dc, act.scheduled.activity_task_scheduled_event_attributes.input,
            AgentCallInput, f"the {AGENT_ACTIVITY} input (event {act.scheduled.event_id})")
        out = await _outcome(self.dc, act, AgentReply)
        step = self.step(req.round, req.index)
        step.agent, step.subtask, step.question = req.agent, req.subtask, req.question
        step.visible, step.saw = req.visible, [v.index for v in req.visible]
        step.status, step.attempts = out.status, out.attempts
        step.errors += out.errors
        step.seconds = _seconds(act.scheduled, act.closed)
        for k, v in _event_ids(act).items():
            setattr(step, k, v)
        reply: AgentReply | None = out.result
        if reply is not None:
            # a self-call that fell back to the conductor model adds to the child's usage
            step.output, step.model = reply.output, reply.model
            step.usage = step.usage + reply.usage
            step.cost_usd += reply.cost_usd

    async def _child(self, child: ChildEvents) -> None:
        """A self-call step: its child's answer is the step's output."""
        at = parse_self_call_id(child.workflow_id)
        if at is None:
            return
        step = self.step(*at)
        step.child_workflow_id = child.workflow_id
        self.trail.self_calls.append(child.workflow_id)
        attrs = child.initiated.start_child_workflow_execution_initiated_event_attributes
        step.scheduled_event_id = step.scheduled_event_id or child.initiated.event_id
        step.scheduled_by_event_id = (step.scheduled_by_event_id
                                      or attrs.workflow_task_completed_event_id)
        if not step.visible:  # the child's task carries what the parent step could see
            task: Task | None = await _decode(self.dc, attrs.input, Task,
                                              f"the self-call task of {child.workflow_id}")
            if task is not None:
                step.visible, step.saw = task.context, [v.index for v in task.context]
        if step.status == "pending":
            step.status = "running"
        if child.closed is None:
            return
        step.closed_event_id = step.closed_event_id or child.closed.event_id
        await self._child_closed(step, child.closed)

    async def _child_closed(self, step: TrailStep, closed: HistoryEvent) -> None:
        if closed.HasField("child_workflow_execution_completed_event_attributes"):
            res: RunResult | None = await _decode(
                self.dc, closed.child_workflow_execution_completed_event_attributes.result,
                RunResult, f"the self-call result (event {closed.event_id})")
            if res is None:
                return
            step.usage = step.usage + res.totals.usage
            step.cost_usd += res.totals.cost_usd
            if step.output is None and res.answer is not None:
                step.output, step.model, step.status = res.answer, "self-call", "done"
                step.attempts = step.attempts or 1
            return
        for attr in _CHILD_CLOSE_ATTRS:
            if closed.HasField(attr):  # type: ignore[arg-type]
                failure = getattr(getattr(closed, attr), "failure", None)
                message = failure.message if failure is not None and failure.message else (
                    attr.removesuffix("_event_attributes").replace("_", " "))
                step.errors.append(AttemptError(attempt=1, message=message, type="child workflow"))
                step.status = "failed"

    async def _workflow_close(self) -> None:
        ev, trail = self.events.closed, self.trail
        if self.recorded is not None:  # what the workflow knew when it wrote the trace
            res = self.recorded.result
            trail.run_status, trail.answer, trail.error = res.status, res.answer, res.error
            self.reward = self.reward or res.reward
        if ev is None:
            return
        trail.status = _CLOSE[ev.event_type]  # type: ignore[assignment]
        trail.closed_at = ev.event_time.ToDatetime(tzinfo=UTC)
        if ev.HasField("workflow_execution_completed_event_attributes"):
            res = await _decode(self.dc, ev.workflow_execution_completed_event_attributes.result,
                                RunResult, "the run's result")
            if res is not None:
                trail.run_status, trail.answer, trail.error = res.status, res.answer, res.error
                self.reward = res.reward or self.reward
        elif ev.HasField("workflow_execution_failed_event_attributes"):
            trail.run_status = trail.run_status or "failed"
            trail.error = ev.workflow_execution_failed_event_attributes.failure.message
        elif ev.HasField("workflow_execution_terminated_event_attributes"):
            reason = ev.workflow_execution_terminated_event_attributes.reason
            trail.error = f"terminated: {reason or 'no reason given'}"
        elif ev.HasField("workflow_execution_timed_out_event_attributes"):
            trail.error = "the run timed out (workflow execution timeout)"

    def _finish(self) -> None:
        trail = self.trail
        trail.reward = self.reward
        question = trail.task.question if trail.task else ""
        trail.rounds = [self.rounds[i] for i in sorted(self.rounds)]
        for rnd in trail.rounds:
            rnd.steps.sort(key=lambda s: s.index)
            rnd.plan_attempts.sort(key=lambda a: a.attempt)
            for a in rnd.plan_attempts:
                trail.usage, trail.cost_usd = trail.usage + a.usage, trail.cost_usd + a.cost_usd
            for s in rnd.steps:
                trail.usage, trail.cost_usd = trail.usage + s.usage, trail.cost_usd + s.cost_usd
                s.question = s.question or question


async def load_trail(
    client: Client, workflow_id: str, run_id: str | None = None
) -> tuple[Trail, RunEvents]:
    """The trail and the grouped events it was built from (for engine.resume)."""
    rid, events = await fetch_events(client, workflow_id, run_id)
    trail = await _Builder(client.data_converter, workflow_id, rid, events).build()
    return trail, events


async def step_trail(client: Client, workflow_id: str, run_id: str | None = None) -> Trail:
    """The run's step trail from its Temporal history alone (the latest run unless `run_id`):
    for each round its plan attempts, and for each step what the agent was asked, what it could
    see, what it answered, its tokens, cost, attempts and errors; then the run's outcome."""
    trail, _ = await load_trail(client, workflow_id, run_id)
    return trail
