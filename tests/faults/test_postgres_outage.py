"""PostgreSQL stopped for OUTAGE_S mid-batch, then started again on the same data directory.

Runs keep calling their agents while the trace store is down; the record activity fails with
TraceStoreUnavailable and is retried until PostgreSQL is back, through the same connection pool
(the worker is never restarted). Nothing is lost, no run fails because of the outage, no answer
the engine received is asked for again, and every run has its trace."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from temporalio.client import Client

from conductor_engine.engine.contracts.names import RECORD_ACTIVITY, batch_child_workflow_id
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.blobs import blob_store
from conductor_engine.engine.storage.database import EmbeddedPostgres
from conductor_engine.engine.storage.trace_store import TraceFilter, TraceStore
from conductor_engine.runtime.client import ConductorClient
from tests.agent_server import Reply
from tests.agent_server.reply import Responder
from tests.batches import wait_done
from tests.conftest import make_pool, running_worker
from tests.faults import arith
from tests.faults.ledger import account

N = 30
OUTAGE_S = 30.0
BEFORE = 5  # traces written before PostgreSQL is stopped
LATENCY_S = 0.3  # every agent answer: the batch is still calling agents when PostgreSQL stops


def slow(answer: Callable[[str], str]) -> Responder:
    return lambda prompt: Reply.ok(answer(prompt)).after(LATENCY_S)


async def record_attempts(client: Client, workflow_id: str) -> int:
    """The attempt on which the run's record activity succeeded (1: it never failed)."""
    scheduled: set[int] = set()
    attempt = 0
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            if event.activity_task_scheduled_event_attributes.activity_type.name \
                    == RECORD_ACTIVITY:
                scheduled.add(event.event_id)
        elif event.HasField("activity_task_started_event_attributes"):
            attrs = event.activity_task_started_event_attributes
            if attrs.scheduled_event_id in scheduled:
                attempt = max(attempt, attrs.attempt)
    return attempt


@pytest.mark.slow  # a whole batch through a fault, 30-60 s: `pytest -m slow`; CI runs it
async def test_postgres_stopped_mid_batch_loses_nothing_and_fails_nothing(
    agent_server, client: Client, settings: Settings, reachable_tmp: Path,
) -> None:
    server = EmbeddedPostgres(reachable_tmp / "pg")
    url = server.start()
    settings = settings.model_copy(update={"database_url": url})
    store = await TraceStore.open(url, blob_store(settings),
                                  blob_threshold=settings.trace_blob_threshold, max_size=2)
    conductor = ConductorClient(client, settings)
    for model, answer in arith.ANSWERS.items():
        agent_server.set_responder(model, slow(answer))
    name = f"pg-{uuid.uuid4().hex[:6]}"
    tasks = arith.tasks(name, N)
    started = time.monotonic()
    try:
        async with running_worker(client, settings, make_pool(agent_server)):
            await conductor.submit_batch(name, tasks, concurrency=5, report=False)
            while await store.count(TraceFilter(batch=name)) < BEFORE:
                await asyncio.sleep(0.1)
            assert server.stop()
            stopped = time.monotonic()
            before = {m: agent_server.billed(m) for m in arith.MODELS.values()}
            await asyncio.sleep(OUTAGE_S)
            during = sum(agent_server.billed(m) - n for m, n in before.items())
            assert server.start() == url  # same socket, same password: the same URL
            restarted = time.monotonic()
            await wait_done(conductor, name, timeout=OUTAGE_S + 120)
            finished = time.monotonic()
        seconds = finished - started
        written = await store.count(TraceFilter(batch=name))
        row = await account(
            f"PostgreSQL stopped {OUTAGE_S:.0f} s mid-batch", client=client, store=store,
            batch=name, task_ids=[t.id for t in tasks],
            billed={m: agent_server.billed(m) for m in arith.MODELS.values()},
            model_of=arith.MODELS, seconds=seconds,
            note=f"stopped after {BEFORE}+ traces; {during} agent answers during the outage; "
                 f"batch done {finished - restarted:.0f} s after the restart",
        )
        attempts = [await record_attempts(client, batch_child_workflow_id(name, t.id))
                    for t in tasks]
    finally:
        await store.close()
        server.stop()
    print(f"\n{row}\nrecord attempts: {sorted(attempts)}; stopped at "
          f"{stopped - started:.1f} s, restarted at {restarted - started:.1f} s")
    row.check()
    assert row.completed == N, row  # the outage fails no run: recording waits it out
    assert written == N
    assert during > 0  # runs went on calling agents while the store was down
    # the runs that finished during the outage recorded only once it was back, on a retry
    assert sum(a > 1 for a in attempts) >= 1, attempts
    assert all(a >= 1 for a in attempts), attempts
