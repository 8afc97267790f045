"""Worker assembly: the workflows and activities one Temporal worker process serves."""

from __future__ import annotations

from datetime import timedelta

from temporalio.client import Client
from temporalio.worker import Worker

from conductor_engine.activities.agent import AgentActivities
from conductor_engine.activities.batch import BatchActivities
from conductor_engine.activities.plan import PlanActivities
from conductor_engine.activities.record import RecordActivities
from conductor_engine.activities.score import score
from conductor_engine.engine.providers import preload
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.trace_store import TraceStore
from conductor_engine.workflows.batch import BatchWorkflow
from conductor_engine.workflows.conduct import ConductWorkflow
from conductor_engine.workflows.train import TrainingWorkflow


def build_worker(
    client: Client,
    settings: Settings,
    pool: Pool,
    *,
    store: TraceStore | None = None,
    max_concurrent_activities: int = 200,
) -> Worker:
    """A worker on the settings' task queue. Agent calls are I/O bound (the local model runs in
    a thread and serialises itself), so many concurrent activities cost little. Without a
    `store` the record activity opens the configured trace store on its first trace."""
    preload([pool.conductor, *pool.agents])
    plans, agents = PlanActivities(pool, settings), AgentActivities(pool)
    records = RecordActivities(settings, pool, store)
    batches = BatchActivities(settings)
    return Worker(
        client,
        task_queue=settings.task_queue,
        workflows=[ConductWorkflow, BatchWorkflow, TrainingWorkflow],
        activities=[plans.write_plan, agents.call_agent, score, records.record,
                    batches.write_batch_report],
        max_concurrent_activities=max_concurrent_activities,
        graceful_shutdown_timeout=timedelta(seconds=settings.worker_shutdown_grace),
    )
