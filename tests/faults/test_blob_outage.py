"""The blob store (S3) unreachable for a while mid-batch, its data intact: a network partition
(tests/faults/proxy.py) between the engine and the S3 server (moto). Every step's answer is
over the payload threshold, so it crosses Temporal only through the blob store. Nothing is lost
and no answer the engine received is asked for again."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from temporalio.client import Client

from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.blobs import BlobStoreError, LocalBlobStore
from conductor_engine.engine.storage.payloads import KEY_PREFIX, data_converter
from conductor_engine.engine.storage.trace_store import TraceFilter, TraceStore
from conductor_engine.runtime.client import ConductorClient, connect_temporal
from tests.agent_server import Reply
from tests.agent_server.reply import Responder
from tests.batches import wait_done
from tests.blob_stores import fresh_bucket
from tests.conftest import make_pool, running_worker
from tests.faults import arith
from tests.faults.ledger import account
from tests.faults.proxy import Proxy
from tests.plans import plan_json

N = 12
OUTAGE_S = 6.0
THRESHOLD = 20_000  # bytes: every answer below is larger, so every step result is a blob


def big(answer: Callable[[str], str]) -> Responder:
    return lambda prompt: Reply.ok(answer(prompt) + " " + "x" * (2 * THRESHOLD)).after(0.2)


@pytest.mark.slow  # a whole batch through a fault, 30-60 s: `pytest -m slow`; CI runs it
async def test_the_blob_store_unreachable_mid_batch_loses_nothing_and_repays_nothing(
    agent_server, client: Client, settings: Settings, trace_store: TraceStore,
    moto_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    bucket = fresh_bucket(moto_url, monkeypatch)
    where = urlsplit(moto_url)
    proxy = Proxy(where.hostname or "127.0.0.1", where.port or 80)
    await proxy.up()
    settings = settings.model_copy(update={
        "s3_bucket": bucket, "s3_endpoint_url": proxy.url, "payload_threshold": THRESHOLD})
    s3_client = await connect_temporal(settings, start_embedded=False)
    conductor = ConductorClient(s3_client, settings)
    agent_server.set_responder("conductor", lambda p: Reply.ok(arith.conductor(p)).after(0.2))
    for model in ("gpt", "claude", "gemini"):
        agent_server.set_responder(model, big(arith.ANSWERS[model]))
    name = f"blobs-{uuid.uuid4().hex[:6]}"
    tasks = arith.tasks(name, N)
    started = time.monotonic()
    try:
        async with running_worker(s3_client, settings, make_pool(agent_server)):
            await conductor.submit_batch(name, tasks, concurrency=4, report=False)
            while await trace_store.count(TraceFilter(batch=name)) < 4:
                await asyncio.sleep(0.1)
            await proxy.down()
            await asyncio.sleep(OUTAGE_S)
            await proxy.up()
            await wait_done(conductor, name)
    finally:
        if proxy.port:
            await proxy.down()
    row = await account(
        f"blob store unreachable {OUTAGE_S:.0f} s mid-batch", client=s3_client,
        store=trace_store, batch=name, task_ids=[t.id for t in tasks],
        billed={m: agent_server.billed(m) for m in arith.MODELS.values()},
        model_of=arith.MODELS, seconds=time.monotonic() - started,
        note=f"every answer {2 * THRESHOLD // 1000} KB, above the payload threshold")
    row.check()
    assert row.completed == N


class FailsFirstPayloadPut(LocalBlobStore):
    """A blob store whose first write of a Temporal payload fails, as S3 does mid-partition
    (it answered the activity's check a moment before)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.failed = 0

    async def put_key(self, key: str, data: bytes) -> None:
        if key.startswith(KEY_PREFIX) and not self.failed:
            self.failed += 1
            raise BlobStoreError("simulated: the S3 endpoint could not be reached")
        await super().put_key(key, data)


async def test_an_answer_that_could_not_be_handed_to_temporal_is_not_bought_again(
    agent_server, settings: Settings, tmp_path: Path,
) -> None:
    """The attempt that received the answer fails (its result could not be stored); the next
    attempt takes the answer the worker stashed (activities/stashed_answers.py), no new call."""
    settings = settings.model_copy(update={"payload_threshold": THRESHOLD,
                                           "blob_dir": tmp_path / "blobs"})
    store = FailsFirstPayloadPut(tmp_path / "blobs")
    flaky = await Client.connect(settings.address, data_converter=data_converter(settings, store))
    agent_server.script("conductor", [Reply.ok(plan_json(("gemini", "Write a long answer.", [])))])
    agent_server.script("gemini", [Reply.ok("long " * THRESHOLD)])
    async with running_worker(flaky, settings, make_pool(agent_server)):
        res = await ConductorClient(flaky, settings).run(Task(question="Write at length."))
    assert store.failed == 1
    assert res.status == "completed" and res.steps[0].attempts == 2
    assert res.answer == "long " * THRESHOLD
    assert agent_server.calls("gemini") == 1 and agent_server.billed("gemini") == 1
