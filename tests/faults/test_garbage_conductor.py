"""A conductor that answers with a megabyte of garbage (brackets, deep nesting, a run of `-`,
half objects, each call different): every run ends as an invalid plan with one clear line,
within its plan attempts; the plan activity never fails, so Temporal never pays for another
completion; every run has its trace, the raw megabyte kept."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable

from temporalio.client import Client

from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.trace_store import TraceStore
from conductor_engine.runtime.client import ConductorClient
from tests.batches import wait_done
from tests.conftest import make_pool, running_worker
from tests.faults import arith
from tests.faults.ledger import account

N = 10
ATTEMPTS = 2
MB = 1_000_000
PIECES = ("{" * 1000, "[" * 1000, '{"a": ' * 500, "-" * 2000, '{"model_ids": [', "\\u0000",
          "model_ids = [", "access_list = [[", '"}]', "\ud800", "```json\n", "<think>")


def garbage_maker() -> Callable[[str], str]:
    """Each call a different megabyte, the same sequence on every run (a seeded generator)."""
    rng, lock = random.Random(17), threading.Lock()

    def garbage(_: str) -> str:
        with lock:
            parts, size = [], 0
            while size < MB:
                piece = rng.choice(PIECES)
                parts.append(piece)
                size += len(piece)
        return "".join(parts)[:MB]

    return garbage


async def test_a_conductor_writing_a_megabyte_of_garbage_costs_one_call_per_attempt(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings,
    trace_store: TraceStore,
) -> None:
    agent_server.set_responder("conductor", garbage_maker())
    name = f"garbage-{uuid.uuid4().hex[:6]}"
    tasks = [t.model_copy(update={"options": t.options.model_copy(
        update={"max_plan_attempts": ATTEMPTS})}) for t in arith.tasks(name, N)]
    started = time.monotonic()
    async with running_worker(client, settings, make_pool(agent_server)):
        await conductor.submit_batch(name, tasks, concurrency=N, report=False)
        await wait_done(conductor, name)
    row = await account(
        "conductor writes 1 MB of garbage", client=client, store=trace_store, batch=name,
        task_ids=[t.id for t in tasks], billed={"conductor": agent_server.billed("conductor")},
        model_of=arith.MODELS, seconds=time.monotonic() - started,
        note=f"{ATTEMPTS} plan attempts a run; every reply a different megabyte")
    row.check()
    assert row.failed == N and set(row.reasons) == {"invalid_plan"}, row
    assert agent_server.calls("conductor") == N * ATTEMPTS, "one call per attempt, no retry"
    traces = await trace_store.batch_traces(name)
    assert all(len(a.raw_text) == MB for t in traces for a in t.rounds[0].attempts)
