"""A provider storm on a 200-task batch (tests/faults/storm.py): 429s with Retry-After, 5xx,
malformed bodies and hangs on every agent, the conductor included. Every run ends, completed or
failed with one clear line; no answer a provider billed is paid for again; every run has its
trace."""

from __future__ import annotations

import time
import uuid

import pytest
from temporalio.client import Client

from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.trace_store import TraceStore
from conductor_engine.runtime.client import ConductorClient
from tests.batches import wait_done
from tests.conftest import make_pool, running_worker
from tests.faults import arith
from tests.faults.ledger import account
from tests.faults.storm import Storm

N = 200
# one attempt of any agent: a hung reply (storm.HANG_S, a minute) costs this. A safety net far
# above a busy reply, since a reply the server wrote in full that reaches the client after its
# timeout is paid again by the retry, rightly (the test measures the engine, not that race):
# on a loaded 2-core machine that happened once at 3 s, and once at 8 s with three training
# benchmarks beside the suite
TIMEOUT_S = 30.0


@pytest.mark.slow  # a whole batch through a fault, 30-60 s: `pytest -m slow`; CI runs it
async def test_a_200_task_batch_in_a_provider_storm_loses_nothing_and_repays_nothing(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings,
    trace_store: TraceStore,
) -> None:
    storm = Storm()
    for model, answer in arith.ANSWERS.items():
        agent_server.set_responder(model, storm.responder(model, answer))
    timeouts = {"timeout_s": TIMEOUT_S}
    pool = make_pool(agent_server, gpt=timeouts, claude=timeouts, gemini=timeouts,
                     conductor=timeouts)
    name = f"storm-{uuid.uuid4().hex[:6]}"
    tasks = arith.tasks(name, N)
    started = time.monotonic()
    async with running_worker(client, settings, pool):
        await conductor.submit_batch(name, tasks, concurrency=N, report=False)
        await wait_done(conductor, name)
    seconds = time.monotonic() - started
    billed = {m: agent_server.billed(m) for m in arith.MODELS.values()}
    faults = ", ".join(f"{n} {k}" for k, n in sorted(storm.drawn.items()) if k != "ok")
    row = await account(
        "provider storm (429 + Retry-After, 5xx, malformed, hangs)", client=client,
        store=trace_store, batch=name, task_ids=[t.id for t in tasks], billed=billed,
        model_of=arith.MODELS, seconds=seconds,
        note=f"{sum(storm.drawn.values())} calls: {faults}; {storm.drawn['ok']} answered")
    row.check()
    assert storm.drawn["429"] and storm.drawn["5xx"] and storm.drawn["malformed"] \
        and storm.drawn["hang"], storm.drawn
    assert row.completed >= N * 0.8, row
