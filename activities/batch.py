"""The batch report activity: write a finished batch's report from its traces, on the
worker's disk (data_dir/batches/NAME); `conductor batch report NAME` writes the same anywhere."""

from __future__ import annotations

from temporalio import activity

from conductor_engine.engine.contracts.names import BATCH_REPORT_ACTIVITY
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.batch_report import write_report
from conductor_engine.engine.storage.shared import shared_store


class BatchActivities:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @activity.defn(name=BATCH_REPORT_ACTIVITY)
    async def write_batch_report(self, name: str) -> str:
        store = await shared_store(self.settings)
        traces = await store.batch_traces(name)
        out = (self.settings.data_dir / "batches" / name).absolute()
        write_report(name, traces, out)
        return str(out)
