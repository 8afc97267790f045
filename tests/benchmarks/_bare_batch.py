"""The bare Temporal baseline of bench_batch.py: a batch with the engine's activity shape per
task and none of its work, so the benchmark can separate the engine's cost from the dev
server's.

BareBatch starts one BareTask child per task, at most `concurrency` at a time (as BatchWorkflow
does). A BareTask runs what a ConductWorkflow of the benchmark runs, as plain activities that
only sleep what their counterparts take on the scripted agents: the plan (an immediate reply),
three steps in a chain (the agents' latency each), the score and the record (no agent call).
No prompts, no SDKs, no database, no traces, no continue-as-new: what is left is Temporal's own
cost of the same activities and children, on the same dev server.

In a module of its own (not the script) so the workflow sandbox can import it by name.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import BaseModel
from temporalio import activity, workflow

SLEEP_ACTIVITY = "bare-sleep"


class BareTaskInput(BaseModel):
    task_id: str
    plan_s: float
    step_s: float
    steps: int
    score_s: float
    record_s: float


class BareBatchInput(BaseModel):
    tasks: list[BareTaskInput]
    concurrency: int


@activity.defn(name=SLEEP_ACTIVITY)
async def bare_sleep(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "ok"


@workflow.defn(name="BareTask")
class BareTask:
    @workflow.run
    async def run(self, task: BareTaskInput) -> str:
        timeout = timedelta(seconds=60)
        await workflow.execute_activity(SLEEP_ACTIVITY, task.plan_s,
                                        start_to_close_timeout=timeout, summary="plan")
        for i in range(task.steps):  # a chain: step i reads step i-1
            await workflow.execute_activity(SLEEP_ACTIVITY, task.step_s,
                                            start_to_close_timeout=timeout, summary=f"step {i}")
        await workflow.execute_activity(SLEEP_ACTIVITY, task.score_s,
                                        start_to_close_timeout=timeout, summary="score")
        await workflow.execute_activity(SLEEP_ACTIVITY, task.record_s,
                                        start_to_close_timeout=timeout, summary="record")
        return task.task_id


@workflow.defn(name="BareBatch")
class BareBatch:
    @workflow.run
    async def run(self, inp: BareBatchInput) -> int:
        slots = asyncio.Semaphore(inp.concurrency)
        parent = workflow.info().workflow_id

        async def one(task: BareTaskInput) -> None:
            async with slots:
                await workflow.execute_child_workflow(BareTask.run, task,
                                                      id=f"{parent}-{task.task_id}")

        await asyncio.gather(*(one(t) for t in inp.tasks))
        return len(inp.tasks)
