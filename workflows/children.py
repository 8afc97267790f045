"""Starting many children from one workflow within what one workflow task may carry.

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
from typing import TypeVar

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from conductor_engine.engine.contracts.limits import START_BYTES_PER_WORKFLOW_TASK
    from conductor_engine.engine.contracts.tasks import Task

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
