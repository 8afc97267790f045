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

The parts: `trail` (the data a trail holds), `events` (a history's events grouped by activity
and child), `reading` (decoding them into a Trail). It reads the activities' input models and
names from engine/contracts, not the activities.
"""

from conductor_engine.runtime.history.events import (
    ActivityEvents,
    ChildEvents,
    RunEvents,
    fetch_events,
    group_events,
)
from conductor_engine.runtime.history.reading import (
    load_trail,
    step_trail,
)
from conductor_engine.runtime.history.trail import (
    AttemptError,
    ExecutionStatus,
    HistoryError,
    ResetRecord,
    StepStatus,
    Trail,
    TrailPlanAttempt,
    TrailRound,
    TrailStep,
)

__all__ = [
    "ActivityEvents",
    "AttemptError",
    "ChildEvents",
    "ExecutionStatus",
    "HistoryError",
    "ResetRecord",
    "RunEvents",
    "StepStatus",
    "Trail",
    "TrailPlanAttempt",
    "TrailRound",
    "TrailStep",
    "fetch_events",
    "group_events",
    "load_trail",
    "step_trail",
]
