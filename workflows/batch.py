"""BatchWorkflow: many conductor runs, at most `concurrency` at a time, resumable.

    tasks ─▶ sliding window of child ConductWorkflows ─▶ (continue-as-new every N children)
          ─▶ report (results JSONL, summary, one Markdown file per task)

Child ids are deterministic (`batch-NAME/TASK_ID`) and started with "allow duplicate failed
only": submitting the same batch again skips every task that already completed and reruns the
failed ones. Before continuing as new the window drains, so no child outlives the run that
started it and the new run needs no handles from the old one.

Temporal's limits hold by construction (engine/contracts/limits.py): at most `concurrency`
(≤ 2,000) children are open at once, and they start in waves that each fit in one workflow
task (workflows/children.py); the tasks are in the blob store, and the input carries only
a reference to them (`task_list`) and the index to go on from, so it stays a few KB for any
number of tasks; and each child returns a summary of its run, a few KB, not the whole run
(prompts, token ids, step outputs), which its trace holds. Inline `tasks` are still accepted:
batches started by an older client replay and finish as they began.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from conductor_engine.engine.contracts.batches import BatchInput, BatchProgress
    from conductor_engine.engine.contracts.names import (
        BATCH_REPORT_ACTIVITY,
        BATCH_WORKFLOW,
        PROGRESS_QUERY,
        batch_child_workflow_id,
    )
    from conductor_engine.engine.contracts.records import RunResult
    from conductor_engine.engine.contracts.strict import revised
    from conductor_engine.engine.contracts.tasks import Task
    from conductor_engine.workflows.children import (
        START_WAVES_PATCH,
        FanOut,
        StartWaves,
        start_bytes,
    )
    from conductor_engine.workflows.tasks import read_slice


@workflow.defn(name=BATCH_WORKFLOW)
class BatchWorkflow:
    def __init__(self) -> None:
        self._progress = BatchProgress()
        self._window: set[asyncio.Task[None]] = set()
        self._children = FanOut(1, StartWaves(enabled=False))

    @workflow.query(name=PROGRESS_QUERY)
    def progress(self) -> BatchProgress:
        return self._progress

    @workflow.run
    async def run(self, inp: BatchInput) -> BatchProgress:
        p = self._progress = inp.progress
        children = self._children = FanOut(
            inp.concurrency, StartWaves(enabled=workflow.patched(START_WAVES_PATCH)))
        children.pending = p.running  # 0: a run drains its window before it continues as new
        listed = inp.task_list if not inp.tasks else None
        p.total = listed.total if listed is not None else len(inp.tasks)
        window = self._window
        read: list[Task] = []  # tasks next_index + len(read) - 1 ... read from the task list
        read_from = inp.next_index
        for i in range(inp.next_index, p.total):
            started = i - inp.next_index
            if started >= inp.children_per_run or workflow.info().is_continue_as_new_suggested():
                await self._drain(window)
                p.continued += 1
                workflow.continue_as_new(
                    revised(inp, next_index=i, progress=p)
                )
            if listed is None:
                task = inp.tasks[i]
            else:
                if i >= read_from + len(read):  # the next slice: at most this run's children
                    read_from = i
                    read = await read_slice(listed, i, inp.children_per_run - started)
                task = read[i - read_from]
            await children.admit()
            p.running += 1
            window.add(asyncio.create_task(self._child(inp.name, task)))
        await self._drain(window)
        if inp.report:
            p.report_dir = await workflow.execute_activity(
                BATCH_REPORT_ACTIVITY, inp.name, result_type=str,
                start_to_close_timeout=timedelta(minutes=10),
                heartbeat_timeout=timedelta(seconds=30),  # it heartbeats while it works
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
        task = revised(task, batch=batch, options=revised(task.options, result="summary"))
        summary = f"{batch} · {' '.join(task.question.split())[:150]}"
        wid = batch_child_workflow_id(batch, task.id)
        # sized without its id, as batches always were: a batch's waves replay as they ran
        outcome = await self._children.start(task, wid, summary, start_bytes(task, summary))
        if outcome is None:
            p.skipped += 1  # completed by an earlier submission of this batch
        elif isinstance(outcome, RunResult):
            p.add(outcome)
        else:
            p.failed += 1  # its trace says why; `conductor resume --batch` retries it
        # not in a `finally`: a workflow evicted from the worker's cache closes this coroutine
        # outside the workflow's event loop, where none of this may run
        p.running -= 1
        self._children.done()
        current = asyncio.current_task()
        if current is not None:
            self._window.discard(current)
