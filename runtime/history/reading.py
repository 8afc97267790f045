"""From grouped events to a Trail: every activity's input and outcome decoded through the
client's data converter (which also fetches payloads kept in the blob store)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC
from typing import Any

from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError, FailureError, TimeoutError

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
from conductor_engine.engine.contracts.plans import Plan
from conductor_engine.engine.contracts.records import AgentReply, PlanAttempt, RunResult
from conductor_engine.engine.contracts.rewards import Reward
from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.runtime.history.events import (
    CHILD_CLOSE_ATTRS,
    CLOSE_STATUS,
    ActivityEvents,
    ChildEvents,
    RunEvents,
    fetch_events,
)
from conductor_engine.runtime.history.trail import (
    AttemptError,
    HistoryError,
    ResetRecord,
    StepStatus,
    Trail,
    TrailPlanAttempt,
    TrailRound,
    TrailStep,
)


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


async def _message(dc: DataConverter, failure: Failure) -> str:
    """A failure's message, decrypted where the failure converter encrypted it (its message
    then reads "Encoded failure" in history)."""
    if not failure.HasField("encoded_attributes"):
        return failure.message
    exc = await dc.decode_failure(failure)
    return getattr(exc, "message", None) or str(exc)


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
            if not step.seen:
                step.sees = s.sees(i)

    async def _agent_call(self, act: ActivityEvents) -> None:
        req: AgentCallInput = await _decode(
            self.dc, act.scheduled.activity_task_scheduled_event_attributes.input,
            AgentCallInput, f"the {AGENT_ACTIVITY} input (event {act.scheduled.event_id})")
        out = await _outcome(self.dc, act, AgentReply)
        step = self.step(req.round, req.index)
        step.agent, step.subtask, step.question = req.agent, req.subtask, req.question
        step.seen, step.sees = req.seen, [v.index for v in req.seen]
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
        if not step.seen:  # the child's task carries what the parent step could see
            task: Task | None = await _decode(self.dc, attrs.input, Task,
                                              f"the self-call task of {child.workflow_id}")
            if task is not None:
                step.seen, step.sees = task.context, [v.index for v in task.context]
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
        for attr in CHILD_CLOSE_ATTRS:
            if closed.HasField(attr):  # type: ignore[arg-type]
                failure = getattr(getattr(closed, attr), "failure", None)
                told = await _message(self.dc, failure) if failure is not None else ""
                message = told or attr.removesuffix("_event_attributes").replace("_", " ")
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
        trail.status = CLOSE_STATUS[ev.event_type]  # type: ignore[assignment]
        trail.closed_at = ev.event_time.ToDatetime(tzinfo=UTC)
        if ev.HasField("workflow_execution_completed_event_attributes"):
            res = await _decode(self.dc, ev.workflow_execution_completed_event_attributes.result,
                                RunResult, "the run's result")
            if res is not None and not (res.summarized and self.recorded is not None):
                trail.run_status, trail.answer, trail.error = res.status, res.answer, res.error
                self.reward = res.reward or self.reward
        elif ev.HasField("workflow_execution_failed_event_attributes"):
            trail.run_status = trail.run_status or "failed"
            trail.error = await _message(
                self.dc, ev.workflow_execution_failed_event_attributes.failure)
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
    """The trail and the grouped events it was built from (for runtime.resume)."""
    rid, events = await fetch_events(client, workflow_id, run_id)
    trail = await _Builder(client.data_converter, workflow_id, rid, events).build()
    return trail, events


async def step_trail(client: Client, workflow_id: str, run_id: str | None = None) -> Trail:
    """The run's step trail from its Temporal history alone (the latest run unless `run_id`):
    for each round its plan attempts, and for each step what the agent was asked, what it could
    see, what it answered, its tokens, cost, attempts and errors; then the run's outcome."""
    trail, _ = await load_trail(client, workflow_id, run_id)
    return trail
