"""Answers a worker has received but not yet handed to Temporal: never bought twice.

Temporal runs an activity at least once. When an attempt's result cannot reach the server, the
attempt fails or times out and the next attempt runs the activity again: for a model call, that
pays for an answer the engine already holds. The usual cause is the blob store: a result over
`payload_threshold` crosses Temporal only as a reference to a blob, and while the store is
unreachable the result cannot be written, so the SDK fails the attempt. Two defences:

- `until_storable`: before returning a result that large, the activity waits for the blob store
  to answer (heartbeating, so Temporal does not take it for dead), until little of its
  start-to-close time is left;
- `StashedAnswers`: every answer is kept in the worker's memory (least recently used first out,
  bounded in bytes) under its activity's identity (workflow, run, activity id); a later attempt
  of the same activity on this worker takes the stashed answer instead of calling the model again.

A retry that lands on another worker, or follows the death of this one, calls again: that is
Temporal's at-least-once guarantee for a call in flight, and the README's fault table says so.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import structlog
from pydantic import BaseModel
from temporalio import activity

from conductor_engine.engine.heartbeat import heartbeats
from conductor_engine.engine.providers import Completion
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.blobs import BlobStore, BlobStoreError, blob_store

MAX_STASHED_BYTES = 256 * 2**20
"""What the stashed answers may take, counted as their text's length: a few hundred ordinary
answers, or a handful of very large ones."""

MARGIN_S = 5.0
"""`until_storable` returns this long before the attempt's start-to-close timeout."""

Key = tuple[str, str, str]


class StashedAnswers:
    """Answers by activity identity, least recently used dropped first beyond `max_bytes`."""

    def __init__(self, max_bytes: int = MAX_STASHED_BYTES) -> None:
        self.max_bytes = max_bytes
        self._answers: OrderedDict[Key, Completion] = OrderedDict()
        self._bytes = 0

    def get(self, key: Key) -> Completion | None:
        found = self._answers.get(key)
        if found is not None:
            self._answers.move_to_end(key)
        return found

    def keep(self, key: Key, answer: Completion) -> None:
        if (old := self._answers.pop(key, None)) is not None:
            self._bytes -= len(old.text)
        self._answers[key] = answer
        self._bytes += len(answer.text)
        while self._bytes > self.max_bytes and len(self._answers) > 1:
            _, dropped = self._answers.popitem(last=False)
            self._bytes -= len(dropped.text)


stashed = StashedAnswers()
"""This process's stashed answers (every worker of the process shares them)."""


def activity_key() -> Key:
    info = activity.info()
    return info.workflow_id or "", info.workflow_run_id or "", info.activity_id


async def stashed_or_called(call: Callable[[], Awaitable[Completion]]) -> Completion:
    """The answer an earlier attempt of this activity received on this worker, else `call()`'s
    (kept for a later attempt)."""
    info = activity.info()
    key = activity_key()
    if info.attempt > 1 and (answer := stashed.get(key)) is not None:
        structlog.get_logger().info(
            "answer reused", workflow_id=key[0], activity_id=key[2], attempt=info.attempt,
            note="an earlier attempt received it but could not hand it to Temporal")
        return answer
    answer = await call()
    stashed.keep(key, answer)
    return answer


_STORES: dict[int, BlobStore] = {}


async def until_storable(result: BaseModel, settings: Settings | None) -> None:
    """Return once the blob store answers, when `result` is large enough to need it; give up
    MARGIN_S before the attempt's start-to-close timeout (the SDK then fails the attempt, and
    the next one takes the stashed answer). Heartbeats while it waits."""
    if settings is None or len(result.model_dump_json()) < settings.payload_threshold:
        return
    store = _STORES.setdefault(id(settings), blob_store(settings))
    info = activity.info()
    left = (info.start_to_close_timeout.total_seconds() if info.start_to_close_timeout
            else 300.0) - (datetime.now(UTC) - info.started_time).total_seconds()
    deadline = time.monotonic() + left - MARGIN_S
    delay = 0.5
    async with heartbeats():
        while True:
            try:
                await store.check()
                return
            except BlobStoreError as e:
                if time.monotonic() + delay > deadline:
                    return
                structlog.get_logger().warning(
                    "blob store unreachable: holding the answer until it answers",
                    workflow_id=info.workflow_id, activity_id=info.activity_id, error=str(e))
                await asyncio.sleep(delay)
                delay = min(2 * delay, 5.0)
