"""The record activity: write a finished run's trace to the trace store.

The write is an upsert keyed by workflow id and run id, so a retry of this activity (a worker
that died after writing, a timeout on the way back) never leaves two traces of one run. The
store is opened on first use, so a worker starts even while PostgreSQL is still coming up; until
it answers, the activity fails with a retryable error that says where it looked.
"""

from __future__ import annotations

import asyncio

import structlog
from temporalio import activity
from temporalio.exceptions import ApplicationError

from engine.blobs import blob_store
from engine.database import DatabaseError, database_url
from engine.embedded import EmbeddedError
from engine.pool import Pool
from engine.settings import Settings
from engine.trace_store import TraceStore
from engine.traces import PolicyRef, RecordRequest, Trace, policy_of

# One connection pool per database per event loop, however many workers the process runs.
_STORES: dict[tuple[object, ...], asyncio.Future[TraceStore]] = {}


async def _open(settings: Settings) -> TraceStore:
    url = await asyncio.to_thread(database_url, settings)
    return await TraceStore.open(
        url, blob_store(settings), blob_threshold=settings.trace_blob_threshold, max_size=4
    )


async def shared_store(settings: Settings) -> TraceStore:
    """The trace store for these settings, opened (and migrated) once, on first use; an open
    that failed is tried again by the next caller."""
    key = (id(asyncio.get_running_loop()), settings.database_url, str(settings.data_dir),
           str(settings.blobs_path), settings.s3_bucket, settings.s3_prefix,
           settings.s3_endpoint_url)
    opening = _STORES.get(key)
    if opening is None:
        opening = _STORES[key] = asyncio.ensure_future(_open(settings))
    try:
        return await asyncio.shield(opening)
    except Exception:
        _STORES.pop(key, None)
        raise


async def close_shared_stores() -> None:
    """Close this event loop's trace stores (a worker process calls this as it stops)."""
    loop = id(asyncio.get_running_loop())
    for key in [k for k in _STORES if k[0] == loop]:
        opening = _STORES.pop(key)
        if opening.done() and not opening.exception():
            await opening.result().close()


class RecordActivities:
    def __init__(self, settings: Settings, pool: Pool, store: TraceStore | None = None) -> None:
        self.settings, self.pool = settings, pool
        self._store = store

    async def store(self) -> TraceStore:
        if self._store is None:
            self._store = await shared_store(self.settings)
        return self._store

    @activity.defn(name="record_trace")
    async def record(self, req: RecordRequest) -> None:
        conductor = self.pool.conductor
        trace = Trace.from_run(
            req.task, req.result,
            policy=policy_of(req.result, PolicyRef(name=conductor.id,
                                                   version=conductor.policy_version)),
            started_at=req.started_at, finished_at=req.finished_at,
            reward=req.result.reward, parent_workflow_id=req.parent_workflow_id,
        )
        try:
            store = await self.store()
            await store.write(trace)
        except (DatabaseError, EmbeddedError, OSError) as e:
            raise ApplicationError(str(e), type="TraceStoreUnavailable") from e
        structlog.get_logger().info(
            "trace recorded", workflow_id=trace.workflow_id, run_id=trace.run_id,
            status=trace.status, reward=trace.reward.value if trace.reward else None,
        )
