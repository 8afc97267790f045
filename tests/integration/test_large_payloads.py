"""A 5 MB agent output through a whole run on the real Temporal dev server: without external
storage Temporal refuses any payload over 2 MB; with it, history holds small references and the
bytes live in the blob store (a local directory, or S3 served by moto)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from conductor_engine.engine.contracts.records import RunResult
from conductor_engine.engine.contracts.tasks import RunOptions, Task
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.blobs import blob_store, ref_for
from conductor_engine.engine.storage.payloads import data_converter
from conductor_engine.runtime.client import ConductorClient, RunFailed, connect_temporal
from conductor_engine.workflows.conduct import ConductWorkflow
from tests.agent_server import AgentServer, Reply
from tests.blob_stores import fresh_bucket, stored_objects
from tests.conftest import make_pool, running_worker
from tests.plans import plan_json

MB = 1024 * 1024


def big_text(tag: str, size: int = 5 * MB) -> str:
    """`size` characters of numbered, non-ASCII lines, so truncation or re-encoding shows."""
    line = f"{tag} → ünïcode line "
    lines, total, i = [], 0, 0
    while total < size:
        lines.append(f"{line}{i:07d}\n")
        total += len(lines[-1])
        i += 1
    return "".join(lines)[:size]


async def run_big(server: AgentServer, client: Client, settings: Settings) -> RunResult:
    """Two steps: gpt writes 5 MB, claude reads it and answers with another 5 MB."""
    first, answer = big_text("first"), big_text("answer")
    server.script("conductor", [Reply.ok(plan_json(
        ("gpt", "Write everything down.", []),
        ("claude", "Rewrite it.", [0]),
    ))])
    server.script("gpt", [Reply.ok(first)])
    server.script("claude", [Reply.ok(answer)])
    conductor = ConductorClient(client, settings)
    async with running_worker(client, settings, make_pool(server)):
        started = time.monotonic()
        res = await conductor.run(Task(question="Write a lot."))
        print(f"5 MB run: {time.monotonic() - started:.2f}s")
    assert res.status == "completed", res.error
    assert res.answer == answer and res.steps[0].output == first  # intact, to the last byte
    assert first in server.requests("claude")[-1].text  # the next step read it
    history = await client.get_workflow_handle(res.workflow_id).fetch_history()
    assert max(e.ByteSize() for e in history.events) < settings.payload_threshold
    # a replayer reads the references back through the same settings
    replayer = Replayer(workflows=[ConductWorkflow], data_converter=data_converter(settings))
    await replayer.replay_workflow(history)
    return res


async def test_a_5mb_agent_output_runs_through_a_whole_run(
    agent_server: AgentServer, client: Client, settings: Settings
) -> None:
    res = await run_big(agent_server, client, settings)
    payloads = [p for p in (settings.blobs_path / "temporal").rglob("*") if p.is_file()]
    assert sum(p.stat().st_size > 5 * MB for p in payloads) >= 2  # both outputs, offloaded
    assert await blob_store(settings).exists(ref_for((res.answer or "").encode()))  # the trace's


async def test_the_same_run_with_blobs_in_s3(
    agent_server: AgentServer, settings: Settings, moto_url: str,
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    bucket = fresh_bucket(moto_url, monkeypatch)
    # a data_dir of its own, as a separate deployment would have (and so its own trace store)
    s3 = settings.model_copy(update={"s3_bucket": bucket, "s3_endpoint_url": moto_url,
                                     "data_dir": tmp_path})
    client = await connect_temporal(s3, start_embedded=False)
    res = await run_big(agent_server, client, s3)
    keys = stored_objects(blob_store(s3))
    assert sum("/temporal/" in k for k in keys) >= 2
    assert await blob_store(s3).exists(ref_for((res.answer or "").encode()))
    assert not s3.blobs_path.exists()  # nothing went to the local directory


async def test_without_external_storage_temporal_refuses_the_output(
    agent_server: AgentServer, settings: Settings
) -> None:
    """The baseline the tests above beat: the plain pydantic converter sends 5 MB inline."""
    client = await Client.connect(settings.address, namespace=settings.temporal_namespace,
                                  data_converter=pydantic_data_converter)
    agent_server.script("conductor", [Reply.ok(plan_json(("gpt", "Write.", [])))])
    agent_server.script("gpt", [Reply.ok(big_text("first"))])
    async with running_worker(client, settings, make_pool(agent_server)):
        with pytest.raises(RunFailed, match="exceeded the error limit"):
            await ConductorClient(client, settings).run(
                Task(question="Write a lot.", options=RunOptions(max_step_attempts=1)))
