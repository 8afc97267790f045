"""The names Temporal knows the engine by, and the ids it gives runs, in one place.

Activity, workflow, query and signal names are written into every workflow history: a running
or recorded run replays only while they keep their values, so change none of them. Ids are
built here and, where a reader needs them back (the audit trail finds a self-call's step in its
child's id), parsed here too, next to the builder that fixes their format.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

# --- activities (the `name=` of each @activity.defn) -------------------------------------------

PLAN_ACTIVITY = "write_plan"
"""The conductor writes a plan (activities/plan.py)."""
AGENT_ACTIVITY = "call_agent"
"""One agent answers one step (activities/agent.py)."""
SCORE_ACTIVITY = "score_run"
"""A run's answer against the task's reference (activities/score.py)."""
RECORD_ACTIVITY = "record_trace"
"""A finished run's trace into the trace store (activities/record.py)."""
BATCH_REPORT_ACTIVITY = "write_batch_report"
"""A finished batch's report on the worker's disk (activities/batch.py)."""
READ_TASKS_ACTIVITY = "read_tasks"
"""A slice of a batch's or training run's task list from the blob store (activities/batch.py)."""
UPDATE_ACTIVITY = "grpo_update"
"""One GRPO update, on the trainer task queue (trainer/service.py)."""
WARMUP_ACTIVITY = "warmup_update"
"""The warm-up on scored plans before a training run's first update (trainer/warmup.py)."""
REHEARSAL_PLANS_ACTIVITY = "warmup_rehearsal_plans"
"""Each training task's candidate plans to rehearse before the warm-up (trainer/warmup.py)."""

# --- workflows, their query and signal ---------------------------------------------------------

BASELINE_POLICY = "baseline"
"""The policy name a fixed plan's run is recorded under (RunOptions.plan): no trained policy."""

CONDUCT_WORKFLOW = "ConductWorkflow"
"""One conductor run (workflows/conduct.py)."""
BATCH_WORKFLOW = "BatchWorkflow"
"""Many conductor runs, bounded concurrency (workflows/batch.py)."""
TRAINING_WORKFLOW = "TrainingWorkflow"
"""Rollouts and GRPO updates, one iteration per run (workflows/train.py)."""
PROGRESS_QUERY = "progress"
"""Every workflow's progress so far (`conductor status`, `batch watch`, `train status`)."""
STOP_SIGNAL = "stop"
"""Asks a training run to end after the iteration in flight."""

# --- task queues (the defaults; Settings may name others) ---------------------------------------

TASK_QUEUE = "conductor"
"""The stem of the queues engine workers run workflows and activities on: a pool's queue is
`pool_task_queue(TASK_QUEUE, pool)`, never this name alone."""
TRAINER_TASK_QUEUE = "trainer"
"""Where the trainer service takes GRPO updates (no agents: the same for every pool)."""

POOL_FINGERPRINT_CHARS = 12
"""Hex digits of the pool's SHA-256 in its queue's name (48 bits: two different pools on one
Temporal share a queue by accident with odds of about 1 in 10^14)."""


def pool_fingerprint(pool: Mapping[str, Any]) -> str:
    """The first POOL_FINGERPRINT_CHARS hex digits of the SHA-256 of a pool's specification
    (`Pool.model_dump(mode="json")`: the conductor, every agent with its model, endpoint,
    parameters and description, whether the conductor is offered) as canonical JSON. Equal
    pools give equal fingerprints wherever they were read; keys are never part of a pool."""
    canonical = json.dumps(pool, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:POOL_FINGERPRINT_CHARS]


def pool_task_queue(stem: str, pool: Mapping[str, Any]) -> str:
    """The task queue of one pool, `STEM-FINGERPRINT` (STEM: Settings.task_queue, `conductor`
    by default). Temporal requires every worker polling a queue to register the same workflows
    and activities with the same meaning; an agent activity means "call agent X of this pool",
    so each pool gets its own queue: a worker serves only its own pool's queue, a client starts
    runs on the queue of the pool it names, and the workflows schedule their activities and
    children on the queue they run on (the SDK's default). A worker with another pool can then
    never take a run's activities, and equal pools (`conductor up` and `conductor run`, both
    on the same pool file) find each other."""
    return f"{stem}-{pool_fingerprint(pool)}"


def plans_task_queue(queue: str) -> str:
    """Where a run on `queue` schedules its plan activities: `QUEUE-plans`, which the same
    worker polls with as many slots as its conductor serves at once (runtime/worker.py). A plan
    waiting for the conductor then waits in Temporal, where only its step deadline counts,
    instead of inside a worker behind other plans, where its plan timeout would count too."""
    return f"{queue}-plans"

# --- workflow ids ---------------------------------------------------------------------------------


def conduct_workflow_id(task_id: str) -> str:
    """A submitted run: `conduct-TASK_ID`."""
    return f"conduct-{task_id}"


def batch_workflow_id(name: str) -> str:
    """Batch NAME: `batch-NAME`."""
    return f"batch-{name}"


def batch_child_workflow_id(batch: str, task_id: str) -> str:
    """A batch's run of one task, `batch-NAME/TASK_ID`: deterministic, so submitting the batch
    again finds the runs that already completed."""
    return f"{batch_workflow_id(batch)}/{task_id}"


def training_workflow_id(name: str) -> str:
    """Training run NAME: `train-NAME`."""
    return f"train-{name}"


def rollout_workflow_id(name: str, chain: str, iteration: int, task_id: str, sample: int) -> str:
    """One rollout of training run NAME, `train-NAME/CHAIN/itN/TASK_ID/SAMPLE`: CHAIN (the start
    of the first run id) keeps a restarted training run's rollouts apart from the last one's."""
    return f"{training_workflow_id(name)}/{chain}/it{iteration}/{task_id}/{sample}"


def heldout_batch(name: str, version: str) -> str:
    """The batch label of training run NAME's held-out evaluation of one version,
    `heldout-NAME-vK`: its traces are read back with TraceStore.batch_traces."""
    return f"heldout-{name}-{version}"


def heldout_workflow_id(name: str, chain: str, version: str, task_id: str) -> str:
    """One held-out run, `train-NAME/CHAIN/heldout-vK/TASK_ID`."""
    return f"{training_workflow_id(name)}/{chain}/heldout-{version}/{task_id}"


def rehearsal_batch(name: str) -> str:
    """The batch label of training run NAME's rehearsals, `rehearse-NAME`: fixed-plan runs of
    the candidate plans before its warm-up, counted towards their plans' mean rewards."""
    return f"rehearse-{name}"


def rehearsal_workflow_id(name: str, chain: str, task_id: str, plan: int, repeat: int,
                          warmup_round: int = 0) -> str:
    """One rehearsal run, `train-NAME/CHAIN/rehearse/TASK_ID/pK/R`: candidate plan K of the
    task, its R-th run; a later warm-up round's `.../rehearse-rN/...`."""
    step = "rehearse" if not warmup_round else f"rehearse-r{warmup_round}"
    return f"{training_workflow_id(name)}/{chain}/{step}/{task_id}/p{plan}/{repeat}"


def warmup_batch(name: str) -> str:
    """The batch label of training run NAME's warm-up samples, `warmup-NAME`: the policy's own
    exploring runs of the training tasks at the start of each warm-up round."""
    return f"warmup-{name}"


def warmup_sample_workflow_id(name: str, chain: str, warmup_round: int, task_id: str,
                              sample: int) -> str:
    """One exploring sample of a warm-up round, `train-NAME/CHAIN/warmup-rN/TASK_ID/SAMPLE`."""
    return f"{training_workflow_id(name)}/{chain}/warmup-r{warmup_round}/{task_id}/{sample}"


def update_id(workflow_id: str, first_run_id: str, iteration: int) -> str:
    """The idempotency key of one training iteration's update, `WORKFLOW_ID/RUN_ID/itN`."""
    return f"{workflow_id}/{first_run_id}/it{iteration}"


def warmup_id(workflow_id: str, warmup_round: int = 0) -> str:
    """The idempotency key of a training run's warm-up, `WORKFLOW_ID/warmup` (a later round's
    `WORKFLOW_ID/warmup/rN`): one per run name and round, so a run resumed after a round that
    published (but was not recorded) finds it."""
    base = f"{workflow_id}/warmup"
    return base if not warmup_round else f"{base}/r{warmup_round}"


_UPDATE_ID = re.compile(r"^train-(?P<name>[^/]+)/[^/]+/it(?P<iteration>\d+)$")


def update_of(update: str) -> tuple[str, int] | None:
    """(training run NAME, iteration) of an `update_id` made by a training run; None for any
    other idempotency key (an update requested by hand)."""
    found = _UPDATE_ID.match(update)
    return (found["name"], int(found["iteration"])) if found else None


_SELF_CALL = re.compile(r"/r(\d+)s(\d+)$")


def self_call_id(parent: str, round: int, index: int) -> str:
    """A self-call's child, `PARENT/rRsI` for round R, step I (both 0-based): the child
    workflow's id under the parent workflow's id, and its task's id under the parent task's."""
    return f"{parent}/r{round}s{index}"


def parse_self_call_id(child_id: str) -> tuple[int, int] | None:
    """(round, step index) of a `self_call_id`; None for an id not made by it."""
    m = _SELF_CALL.search(child_id)
    return (int(m.group(1)), int(m.group(2))) if m else None
