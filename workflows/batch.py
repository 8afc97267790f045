"""BatchWorkflow: many conductor runs, at most `concurrency` at a time, resumable.

    tasks ─▶ sliding window of child ConductWorkflows ─▶ (continue-as-new every N children)
          ─▶ report (results JSONL, summary, one Markdown file per task)

Child ids are deterministic (`batch-NAME/TASK_ID`) and started with "allow duplicate failed
only": submitting the same batch again skips every task that already completed and reruns the
failed ones. Before continuing as new the window drains, so no child outlives the run that
started it and the new run needs no handles from the old one.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.common import RetryPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ChildWorkflowError, WorkflowAlreadyStartedError

with workflow.unsafe.imports_passed_through():
    from conductor_engine.engine.contracts.names import (
        BATCH_REPORT_ACTIVITY,
        BATCH_WORKFLOW,
        PROGRESS_QUERY,
        batch_child_workflow_id,
    )
    from conductor_engine.engine.contracts.records import RunResult
    from conductor_engine.engine.contracts.search_attributes import task_search_attributes
    from conductor_engine.engine.tasks.model import Task
    from conductor_engine.workflows.conduct import ConductWorkflow


class BatchProgress(BaseModel):
    """What `conductor batch watch` shows; carried across continue-as-new."""

    total: int = 0
    completed: int = 0
    failed: int = 0
    skipped: int = Field(default=0, description="completed by an earlier submission")
    running: int = 0
    scored: int = 0
    reward_sum: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    continued: int = Field(default=0, description="continue-as-new count")
    report_dir: str | None = None
    finished: bool = False

    @property
    def done(self) -> int:
        return self.completed + self.failed + self.skipped

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.scored if self.scored else None

    def add(self, res: RunResult) -> None:
        self.completed += 1
        if res.reward is not None and res.reward.value is not None:
            self.scored += 1
            self.reward_sum += res.reward.value
        self.input_tokens += res.totals.usage.input_tokens
        self.output_tokens += res.totals.usage.output_tokens
        self.cost_usd += res.totals.cost_usd


class BatchInput(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    tasks: list[Task]
    concurrency: int = Field(default=50, ge=1, le=10_000)
    report: bool = True
    children_per_run: int = Field(
        default=500, ge=1, description="continue as new after starting this many children"
    )
    next_index: int = 0
    progress: BatchProgress = Field(default_factory=BatchProgress)


@workflow.defn(name=BATCH_WORKFLOW)
class BatchWorkflow:
    def __init__(self) -> None:
        self._progress = BatchProgress()
        self._window: set[asyncio.Task[None]] = set()

    @workflow.query(name=PROGRESS_QUERY)
    def progress(self) -> BatchProgress:
        return self._progress

    @workflow.run
    async def run(self, inp: BatchInput) -> BatchProgress:
        p = self._progress = inp.progress
        p.total = len(inp.tasks)
        window = self._window
        for i in range(inp.next_index, len(inp.tasks)):
            started = i - inp.next_index
            if started >= inp.children_per_run or workflow.info().is_continue_as_new_suggested():
                await self._drain(window)
                p.continued += 1
                workflow.continue_as_new(
                    inp.model_copy(update={"next_index": i, "progress": p})
                )
            await workflow.wait_condition(lambda: p.running < inp.concurrency)
            p.running += 1
            window.add(asyncio.create_task(self._child(inp.name, inp.tasks[i])))
        await self._drain(window)
        if inp.report:
            p.report_dir = await workflow.execute_activity(
                BATCH_REPORT_ACTIVITY, inp.name, result_type=str,
                start_to_close_timeout=timedelta(minutes=10),
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=30)),
                summary=f"report · {inp.name}",
            )
        p.finished = True
        return p

    async def _drain(self, window: set[asyncio.Task[None]]) -> None:
        if window:
            await asyncio.gather(*list(window))

    async def _child(self, batch: str, task: Task) -> None:
        p = self._progress
        task = task.model_copy(update={"batch": batch})
        try:
            res = await workflow.execute_child_workflow(
                ConductWorkflow.run, task, id=batch_child_workflow_id(batch, task.id),
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
                search_attributes=task_search_attributes(task),
                static_summary=f"{batch} · {' '.join(task.question.split())[:150]}",
            )
            p.add(res)
        except WorkflowAlreadyStartedError:
            p.skipped += 1  # completed by an earlier submission of this batch
        except ChildWorkflowError:
            p.failed += 1  # its trace says why; `conductor resume --batch` retries it
        # not in a `finally`: a workflow evicted from the worker's cache closes this coroutine
        # outside the workflow's event loop, where none of this may run
        p.running -= 1
        current = asyncio.current_task()
        if current is not None:
            self._window.discard(current)
