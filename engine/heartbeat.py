"""Heartbeating: how a long activity stays cancellable and how a dead worker is noticed fast.

Temporal delivers a workflow's cancellation to a running activity only in answer to a heartbeat,
and notices a worker that died mid-activity only when its heartbeats stop (otherwise only at the
start-to-close timeout: 300 s for a plan). So every activity that may run long (planning, an
agent call, scoring with a code verifier, a batch report, a GRPO update) runs its work inside
`heartbeats()`, and the workflow sets a `heartbeat_timeout` where it schedules it. Shared by the
activities and the trainer's update, which is why it lives in the engine, below both; it is
behaviour, not a value two layers exchange, so not in the contracts.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import TypeVar

from temporalio import activity

T = TypeVar("T")

BEATS_PER_TIMEOUT = 3
"""Heartbeats sent per heartbeat timeout: one late or lost beat never times an activity out."""


@asynccontextmanager
async def heartbeats() -> AsyncIterator[None]:
    """Heartbeat every third of the activity's heartbeat timeout while the body runs; no
    heartbeat timeout set (an older workflow, a test environment): do nothing.

    The beats come from a task on the event loop, so the body must not block the loop (run
    blocking work with asyncio.to_thread). The task is cancelled when the body ends, however
    it ends, and the body's own CancelledError (a cancellation Temporal delivered in answer to
    a beat) propagates untouched: swallowing it would leave Temporal waiting.
    """
    timeout = activity.info().heartbeat_timeout
    if not timeout:
        yield
        return
    every = max(0.1, timeout.total_seconds() / BEATS_PER_TIMEOUT)

    async def beat() -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(every)

    beats = asyncio.create_task(beat())
    try:
        yield
    finally:
        beats.cancel()


async def heartbeating(call: Awaitable[T]) -> T:
    """Await `call` inside `heartbeats()`."""
    async with heartbeats():
        return await call
