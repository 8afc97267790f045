"""Heartbeating: how a long activity (an agent call, a GRPO update) stays cancellable.

Temporal delivers a workflow's cancellation to a running activity only in answer to a heartbeat,
so every activity that may run for minutes wraps its work in `heartbeating`. Shared by the agent
activity and the trainer's update, which is why it lives below both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from temporalio import activity

T = TypeVar("T")


async def heartbeating(call: Awaitable[T]) -> T:
    """Await `call`, heartbeating every third of the heartbeat timeout (at least every second)
    so that a cancellation reaches it. No heartbeat timeout set: just await it.

    The heartbeat task is cancelled when the call ends, however it ends, and the call's own
    CancelledError propagates untouched: swallowing it would leave Temporal waiting.
    """
    timeout = activity.info().heartbeat_timeout
    if not timeout:
        return await call
    every = max(1.0, timeout.total_seconds() / 3)

    async def beat() -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(every)

    beats = asyncio.create_task(beat())
    try:
        return await call
    finally:
        beats.cancel()
