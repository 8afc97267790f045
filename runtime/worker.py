"""Worker assembly: the workflows and activities one Temporal worker process serves."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

import structlog
from temporalio.client import Client
from temporalio.worker import Worker

from conductor_engine.activities.agent import AgentActivities
from conductor_engine.activities.batch import BatchActivities
from conductor_engine.activities.plan import PlanActivities
from conductor_engine.activities.record import RecordActivities
from conductor_engine.activities.score import score
from conductor_engine.engine.contracts.names import plans_task_queue
from conductor_engine.engine.providers import preload
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.rewards import sandbox
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.trace_store import TraceStore
from conductor_engine.runtime.client import task_queue_of
from conductor_engine.workflows.batch import BatchWorkflow
from conductor_engine.workflows.conduct import ConductWorkflow
from conductor_engine.workflows.train import TrainingWorkflow

log = structlog.get_logger(__name__)


def start_code_sandbox(settings: Settings) -> sandbox.Isolation:
    """Configure the code verifier's sandbox and probe it now, so that a worker that cannot
    isolate model-written code says so when it starts, not at its first code task."""
    sandbox.configure(sandbox.SandboxConfig(
        backend=settings.code_sandbox, uid=settings.code_sandbox_uid,
        gid=settings.code_sandbox_uid))
    iso = sandbox.isolation()
    if iso.backend is None:
        log.error("code verifier will refuse to run code", reason=iso.refusal)
    elif iso.backend == "unconfined":
        log.warning("code verifier runs model-written code WITHOUT isolation (code_sandbox = "
                    "unconfined): never train on such rewards")
    else:
        log.info("code sandbox ready", backend=iso.backend, root=iso.root)
    return iso


def plan_slots(pool: Pool, max_concurrent_activities: int) -> int:
    """How many plan attempts one worker runs at once. A local conductor generates in this
    process, a batch at a time (engine/providers/local/batching.py): a plan started beyond one
    batch would wait in that queue with its plan timeout running, and on a busy CPU fail as
    `plan_failed` for no fault of its own. So a local conductor gets one batch of slots, and the
    plans beyond it wait in Temporal (shown there as scheduled), where only the step deadline
    counts. On a CPU a training rollout's seeded plan generates alone (`Job.batch_key`), so a
    started one may still wait for the others of its batch; a machine too busy even for that
    lowers CONDUCTOR_LOCAL_MAX_BATCH or the settings' `plan_slots`. A served conductor (an API,
    vLLM) batches on its own side: every slot."""
    if pool.conductor.provider == "local":
        from conductor_engine.engine.providers.local import batching
        return min(batching.queue.max_batch, max_concurrent_activities)
    return max_concurrent_activities


@asynccontextmanager
async def build_worker(
    client: Client,
    settings: Settings,
    pool: Pool,
    *,
    store: TraceStore | None = None,
    max_concurrent_activities: int = 200,
) -> AsyncIterator[Worker]:
    """Run a worker on `pool`'s task queue (`task_queue_of`) for as long as the block runs, so
    it never takes a run started for another pool (whose agents this one may lack), and beside
    it a worker on the same queue's plans queue (`plans_task_queue`) with the settings'
    `plan_slots` (0: `plan_slots` below). Agent calls are I/O bound (the local
    model runs in a thread and serialises itself), so many concurrent activities cost little.
    Without a `store` the record activity opens the configured trace store on its first
    trace. Yields the pool queue's worker."""
    preload([pool.conductor, *pool.agents])
    start_code_sandbox(settings)
    plans, agents = PlanActivities(pool, settings), AgentActivities(pool, settings)
    records = RecordActivities(settings, pool, store)
    batches = BatchActivities(settings)
    queue = task_queue_of(settings, pool)
    grace = timedelta(seconds=settings.worker_shutdown_grace)
    runs = Worker(
        client,
        task_queue=queue,
        workflows=[ConductWorkflow, BatchWorkflow, TrainingWorkflow],
        activities=[agents.call_agent, score, records.record,
                    batches.read_tasks, batches.write_batch_report],
        max_concurrent_activities=max_concurrent_activities,
        graceful_shutdown_timeout=grace,
    )
    planner = Worker(
        client,
        task_queue=plans_task_queue(queue),
        activities=[plans.write_plan],
        max_concurrent_activities=settings.plan_slots or plan_slots(
            pool, max_concurrent_activities),
        graceful_shutdown_timeout=grace,
    )
    async with planner, runs:
        yield runs
