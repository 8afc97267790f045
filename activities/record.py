"""The record activity: write a finished run's trace to the trace store.

The write is an upsert keyed by workflow id and run id, so a retry of this activity (a worker
that died after writing, a timeout on the way back) never leaves two traces of one run. The
store is opened on first use, so a worker starts even while PostgreSQL is still coming up; until
it answers, the activity fails with a retryable error that says where it looked (type
TraceStoreUnavailable). A row PostgreSQL refuses for good (a value out of range, an oversized
value, a constraint the row breaks: trace_store.REJECTED) fails at once, non-retryable, type
TraceRejected. Text PostgreSQL cannot hold (NUL, lone surrogates) never gets that far: the store
keeps it exactly, in the blob store (blob_refs.py).
"""

from __future__ import annotations

import asyncpg
import structlog
from temporalio import activity
from temporalio.exceptions import ApplicationError

from conductor_engine.engine import observability as metrics
from conductor_engine.engine.contracts.activities import RecordRequest
from conductor_engine.engine.contracts.names import RECORD_ACTIVITY
from conductor_engine.engine.contracts.policy_versions import version_label
from conductor_engine.engine.contracts.traces import PolicyRef, Trace, policy_of
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.database import DatabaseError
from conductor_engine.engine.storage.shared_store import shared_store
from conductor_engine.engine.storage.trace_store import TraceRejected, TraceStore

UNAVAILABLE = (DatabaseError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError)
"""Errors of a trace store that is down, restarting or overloaded: retried, within the
workflow's record deadline. (TraceRejected is handled before, being a refusal for good.)"""


class RecordActivities:
    def __init__(self, settings: Settings, pool: Pool, store: TraceStore | None = None) -> None:
        self.settings, self.pool = settings, pool
        self._store = store

    async def store(self) -> TraceStore:
        if self._store is None:
            self._store = await shared_store(self.settings)
        return self._store

    @activity.defn(name=RECORD_ACTIVITY)
    async def record(self, req: RecordRequest) -> None:
        conductor = self.pool.conductor
        trace = Trace.from_run(
            req.task, req.result,
            policy=policy_of(req.result, PolicyRef(name=conductor.id,
                                                   version=version_label(conductor.policy_version))),
            started_at=req.started_at, finished_at=req.finished_at,
            reward=req.result.reward, parent_workflow_id=req.parent_workflow_id,
        )
        try:
            store = await self.store()
            await store.write(trace)
        except TraceRejected as e:  # the same row fails every time: do not retry it
            raise ApplicationError(str(e), type="TraceRejected", non_retryable=True) from e
        except UNAVAILABLE as e:
            raise ApplicationError(f"trace store unavailable: {e}",
                                   type="TraceStoreUnavailable") from e
        if req.task.frame.depth == 0:  # a self-call's sub-run is part of its parent's run
            metrics.record_run(
                activity.metric_meter(), conductor=trace.policy.name,
                policy_version=trace.policy.version, status=trace.status,
                reward=trace.reward.value if trace.reward else None, verifier=req.task.verifier)
        structlog.get_logger().info(
            "trace recorded", workflow_id=trace.workflow_id, run_id=trace.run_id,
            status=trace.status, reward=trace.reward.value if trace.reward else None,
        )
