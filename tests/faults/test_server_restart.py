"""The Temporal server killed (SIGKILL) mid-batch and started again on the same SQLite file and
ports. The worker and the client are not restarted: they reconnect by themselves, the batch goes
on from the state the server had written, nothing is lost, no answer the engine received is asked
for again, and every run has its trace."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.trace_store import TraceFilter, TraceStore
from conductor_engine.runtime.client import ConductorClient, connect_temporal
from conductor_engine.runtime.embedded import EmbeddedTemporal
from tests.agent_server import Reply
from tests.agent_server.reply import Responder
from tests.batches import wait_done
from tests.conftest import free_port, make_pool, running_worker
from tests.faults import arith
from tests.faults.ledger import account

N = 30
BEFORE = 8  # runs finished (traces written) before the server is killed
DOWN_S = 3.0  # between the kill and the new start
LATENCY_S = 0.3  # every agent answer: calls are in flight when the server dies


def slow(answer: Callable[[str], str]) -> Responder:
    return lambda prompt: Reply.ok(answer(prompt)).after(LATENCY_S)


async def test_the_temporal_server_killed_mid_batch_loses_nothing_and_repays_nothing(
    agent_server, settings: Settings, trace_store: TraceStore, tmp_path: Path,
) -> None:
    server = EmbeddedTemporal(tmp_path / "temporal", free_port(), free_port())
    server.start(detached=False)
    try:
        settings = settings.model_copy(update={"temporal_address": f"127.0.0.1:{server.port}"})
        client = await connect_temporal(settings, start_embedded=False)
        conductor = ConductorClient(client, settings)
        for model, answer in arith.ANSWERS.items():
            agent_server.set_responder(model, slow(answer))
        name = f"restart-{uuid.uuid4().hex[:6]}"
        tasks = arith.tasks(name, N)
        started = time.monotonic()
        async with running_worker(client, settings, make_pool(agent_server)):
            await conductor.submit_batch(name, tasks, concurrency=5, report=False)
            while await trace_store.count(TraceFilter(batch=name)) < BEFORE:
                await asyncio.sleep(0.05)
            assert server.process is not None
            server.process.send_signal(signal.SIGKILL)
            await asyncio.to_thread(server.process.wait)
            killed = time.monotonic()
            done_at_kill = await trace_store.count(TraceFilter(batch=name))
            server.process = None
            await asyncio.sleep(DOWN_S)
            await asyncio.to_thread(server.start, detached=False)
            restarted = time.monotonic()
            await wait_done(conductor, name, timeout=180)
            finished = time.monotonic()
        row = await account(
            "Temporal server killed (SIGKILL) and restarted mid-batch", client=client,
            store=trace_store, batch=name, task_ids=[t.id for t in tasks],
            billed={m: agent_server.billed(m) for m in arith.MODELS.values()},
            model_of=arith.MODELS, seconds=finished - started,
            note=f"killed after {done_at_kill} runs, down {restarted - killed:.0f} s (start "
                 f"included); batch done {finished - restarted:.0f} s after the restart",
        )
    finally:
        server.stop()
    print(f"\n{row}\nkilled at {killed - started:.1f} s, up again at {restarted - started:.1f} s,"
          f" done at {finished - started:.1f} s")
    row.check()
    assert row.completed == N, row
