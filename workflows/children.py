"""The child fan-out: many ConductWorkflow children of one workflow (a batch, a training run's
rollouts, its held-out runs), under the pending-children limit, in waves that fit one workflow
task, each collected as its result, its failure, or "ran before" (a resumed batch, a reset).

`FanOut` is the one place a child run is started and collected. It admits children two ways,
because recorded histories replay only on the admission they ran with: `admit()` for a loop that
must not run ahead of its window (a batch reads its tasks slice by slice and continues as new),
and `run()` taking a slot itself for children gathered at once (a training iteration).

Starting many children from one workflow within what one workflow task may carry:

All the commands of a workflow task go to the server in one gRPC message of at most 4 MiB, and
each child start carries its child's whole task. A batch or training run that starts hundreds of
children at once (its window or its semaphore opening) would put them all in one workflow task:
past 4 MiB the SDK fails that task and the server terminates the workflow
(engine/contracts/limits.py). `StartWaves` lets starts join the current wave while it holds
under START_BYTES_PER_WORKFLOW_TASK bytes; the next start waits until every start of the wave
has been confirmed (the child started, or refused as already started). Waiting ends the
workflow task, so a wave never shares one with the next.

Measured on the dev server: 2,000 children of 2 KB tasks in one workflow task fail it with
GRPC_MESSAGE_TOO_LARGE, and the server terminates the workflow; in waves, all 2,000 start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeAlias, TypeVar

from temporalio import workflow
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import ChildWorkflowError, WorkflowAlreadyStartedError

with workflow.unsafe.imports_passed_through():
    from conductor_engine.engine.contracts.limits import START_BYTES_PER_WORKFLOW_TASK
    from conductor_engine.engine.contracts.records import RunResult
    from conductor_engine.engine.contracts.search_attributes import task_search_attributes
    from conductor_engine.engine.contracts.tasks import Task
    from conductor_engine.workflows.conduct import ConductWorkflow

START_WAVES_PATCH = "child-start-waves"
"""Runs started before waves existed replay as they ran (one workflow task for a whole window)."""

COMMAND_OVERHEAD_BYTES = 1024
"""A child start's bytes besides its task: id, type, queue, search attributes, summary."""

H = TypeVar("H")


def start_bytes(task: Task, *texts: str) -> int:
    """About how many bytes starting a child with `task` adds to a workflow task."""
    return (len(task.model_dump_json().encode()) + sum(len(t.encode()) for t in texts)
            + COMMAND_OVERHEAD_BYTES)


class StartWaves:
    """Child starts in waves of at most `budget` bytes, one workflow task each. `enabled` is
    False for a run that started before waves existed (see START_WAVES_PATCH)."""

    def __init__(self, enabled: bool, budget: int = START_BYTES_PER_WORKFLOW_TASK) -> None:
        self.enabled, self.budget = enabled, budget
        self.unconfirmed = 0  # bytes of starts sent (or about to be) but not yet confirmed
        # One start at a time is admitted: the SDK checks every waiting condition in one pass,
        # so many waiters would all see the same room and all go at once.
        self._admission = asyncio.Lock()

    async def start(self, size: int, start: Callable[[], Awaitable[H]]) -> H:
        """`start()` (a `workflow.start_child_workflow`) in the current wave if it has room
        for `size` more bytes, else in the next one, once every start of this one is confirmed
        (whole waves: waiting only for room would send one start per workflow task as the
        confirmations trickle in). A start larger than the budget goes in a wave of its own."""
        if self.enabled:
            async with self._admission:
                if self.unconfirmed and self.unconfirmed + size > self.budget:
                    await workflow.wait_condition(lambda: self.unconfirmed == 0)
                self.unconfirmed += size
        else:
            self.unconfirmed += size
        try:
            return await start()
        finally:  # started, or refused (already started): either way no longer in the wave
            self.unconfirmed -= size


ChildOutcome: TypeAlias = RunResult | ChildWorkflowError | None
"""A child run's result (a summary), the error it failed with, or None: a run of that id ran
before (completed by an earlier submission of a batch, or before a reset of this workflow)."""


class FanOut:
    """ConductWorkflow children of one workflow: at most `limit` pending at once, started in
    waves (StartWaves), each collected as a ChildOutcome. Ids are the caller's and
    deterministic, started with "allow duplicate failed only", so running the same children
    again skips the ones that completed and reruns the failed ones."""

    def __init__(self, limit: int, waves: StartWaves) -> None:
        self.limit, self.waves = limit, waves
        self.pending = 0  # children admitted and not yet collected (admit/done)
        self._slots = asyncio.Semaphore(limit)

    async def admit(self) -> None:
        """Wait until a child may start (fewer than `limit` pending), and count it pending;
        `done()` when it is collected. For a loop that starts one child at a time."""
        await workflow.wait_condition(lambda: self.pending < self.limit)
        self.pending += 1

    def done(self) -> None:
        self.pending -= 1

    async def run(self, task: Task, wid: str, summary: str) -> ChildOutcome:
        """Start `task` as child `wid` once a slot is free, and collect it: for children
        gathered at once."""
        async with self._slots:
            return await self.start(task, wid, summary)

    async def start(self, task: Task, wid: str, summary: str, size: int | None = None
                    ) -> ChildOutcome:
        """Start `task` as child `wid` in the current wave, and collect it (no slot taken:
        the caller admitted it). `size`: the bytes the wave counts for it, by default
        `start_bytes(task, wid, summary)` (a batch counts its own way: its waves replay)."""
        size = start_bytes(task, wid, summary) if size is None else size
        try:
            child = await self.waves.start(size, lambda: (
                workflow.start_child_workflow(
                    ConductWorkflow.run, task, id=wid,
                    id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
                    search_attributes=task_search_attributes(task), static_summary=summary,
                )))
            result: RunResult = await child
        except WorkflowAlreadyStartedError:
            return None
        except ChildWorkflowError as e:
            return e
        return result
