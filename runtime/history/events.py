"""Reading history: a run's events grouped by what they belong to (activities, children),
before anything is decoded."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflow.v1 import PendingActivityInfo
from temporalio.client import Client, WorkflowHistory
from temporalio.service import RPCError

from conductor_engine.runtime.history.trail import (
    HistoryError,
)

CLOSE_STATUS = {  # a run's closing event -> its ExecutionStatus
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED: "completed",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED: "failed",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED: "cancelled",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED: "terminated",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT: "timed_out",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW: "continued_as_new",
}


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


CHILD_CLOSE_ATTRS = (  # where a child's closing event keeps its details
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
        elif e.event_type in CLOSE_STATUS:
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
            for attr in CHILD_CLOSE_ATTRS:
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
