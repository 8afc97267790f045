"""The worker process SIGKILLed mid-batch, with model calls in flight, and a new worker started:
every run ends, nothing a provider answered is asked for again, every run has its trace. The
kill comes when every call in flight is held by the agent server (tests/faults/gate.py), so the
figures do not depend on timing."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

from conductor_engine.engine.contracts.names import batch_child_workflow_id
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.trace_store import TraceFilter, TraceStore
from conductor_engine.runtime.client import ConductorClient
from tests.batches import wait_done
from tests.conftest import make_pool, write_pool
from tests.faults import arith
from tests.faults.gate import Gate
from tests.faults.ledger import account
from tests.faults.worker_process import start_worker

N = 30
AGENT_TIMEOUT_S = 5.0  # a call held when the worker died is retried after this


@pytest.mark.slow  # a whole batch through a fault, 30-60 s: `pytest -m slow`; CI runs it
async def test_a_worker_killed_mid_batch_loses_nothing_and_repays_nothing(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings,
    trace_store: TraceStore, tmp_path: Path,
) -> None:
    gate = Gate()
    for model, answer in arith.ANSWERS.items():
        agent_server.set_responder(model, gate(answer))
    timeouts = {"timeout_s": AGENT_TIMEOUT_S}
    pool_file = write_pool(make_pool(agent_server, gpt=timeouts, claude=timeouts,
                                     gemini=timeouts, conductor=timeouts), tmp_path / "pool.toml")
    name = f"kill-{uuid.uuid4().hex[:6]}"
    tasks = arith.tasks(name, N)
    runs = [batch_child_workflow_id(name, t.id) for t in tasks]
    log = tmp_path / "worker.log"
    started = time.monotonic()
    first = start_worker(settings, pool_file, log)
    try:
        await conductor.submit_batch(name, tasks, concurrency=8, report=False)
        while await trace_store.count(TraceFilter(batch=name)) < 8:
            await asyncio.sleep(0.1)
        gate.close()
        while gate.holding == 0 or not await gate.quiet(client, runs):
            await asyncio.sleep(0.1)
        in_flight = gate.holding
        first.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        first.kill()
        gate.open()
    second = start_worker(settings, pool_file, log)
    try:
        await wait_done(conductor, name)
    finally:
        second.terminate()
        second.wait(timeout=30)
    row = await account(
        "worker SIGKILLed mid-batch", client=client, store=trace_store, batch=name,
        task_ids=[t.id for t in tasks],
        billed={m: agent_server.billed(m) for m in arith.MODELS.values()},
        model_of=arith.MODELS, seconds=time.monotonic() - started,
        note=f"{in_flight} model calls in flight at the kill, asked again on the new worker")
    row.check()
    assert row.completed == N, log.read_text()[-3000:]
