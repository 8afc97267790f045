"""The batch activities: read a slice of a task list from the blob store (batches and training
runs carry only a reference to their tasks), and write a finished batch's report from its
traces, on the worker's disk (data_dir/batches/NAME); `conductor batch report NAME` writes the
same anywhere."""

from __future__ import annotations

import asyncio

from temporalio import activity
from temporalio.exceptions import ApplicationError

from conductor_engine.engine.contracts.names import BATCH_REPORT_ACTIVITY, READ_TASKS_ACTIVITY
from conductor_engine.engine.contracts.task_list_refs import TaskSlice
from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.heartbeat import heartbeats
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.batch_report import write_report
from conductor_engine.engine.storage.blobs import BlobCorrupt, BlobNotFound, blob_store
from conductor_engine.engine.storage.shared_store import shared_store
from conductor_engine.engine.storage.task_list_chunks import ChunkCache, TaskListError

MISSING_CHUNK_ATTEMPTS = 3
"""Reads of a task list chunk that is not in the blob store before the run fails."""


class BatchActivities:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._chunks = ChunkCache(blob_store(settings))

    @activity.defn(name=READ_TASKS_ACTIVITY)
    async def read_tasks(self, part: TaskSlice) -> list[Task]:
        """`part.limit` tasks of one chunk from `part.start`. A store that cannot be reached is
        retried like any activity; a chunk that is not there is retried twice (another worker,
        set up like the client, may run the retry), then fails the batch or training run with
        what to set; a chunk whose bytes or lines are wrong fails it at once."""
        try:
            return await self._chunks.read(part)
        except (BlobCorrupt, TaskListError) as e:
            raise ApplicationError(str(e), type=type(e).__name__, non_retryable=True) from e
        except BlobNotFound as e:
            raise ApplicationError(
                f"task list chunk missing: {e}. The client that started this batch or training "
                "run wrote its tasks to its own blob store: every client and worker must use the "
                "same CONDUCTOR_S3_BUCKET (and CONDUCTOR_S3_ENDPOINT_URL), or the same "
                "CONDUCTOR_BLOB_DIR on a shared disk", type="TaskListMissing",
                non_retryable=activity.info().attempt >= MISSING_CHUNK_ATTEMPTS) from e

    @activity.defn(name=BATCH_REPORT_ACTIVITY)
    async def write_batch_report(self, name: str) -> str:
        """Reading thousands of traces and writing the report can take minutes: it heartbeats
        throughout, and the writing runs in a thread so that the beats keep coming."""
        async with heartbeats():
            store = await shared_store(self.settings)
            traces = await store.batch_traces(name)
            out = (self.settings.data_dir / "batches" / name).absolute()
            await asyncio.to_thread(write_report, name, traces, out)
            return str(out)
