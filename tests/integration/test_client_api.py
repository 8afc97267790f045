"""The Python client API as a user scripts it: submit, result, cancel and list, on the real
Temporal dev server; a cancel reaches the agent call in flight and leaves a cancelled trace; a
task built in Python gets the checks a task file's line gets, before anything starts."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.service import RPCError

from conductor_engine.engine.contracts.names import batch_workflow_id
from conductor_engine.engine.contracts.tasks import RunOptions, Task
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.trace_store import TraceStore
from conductor_engine.runtime.client import ConductorClient, RunFailed, workflow_id_for
from tests.agent_server import Reply
from tests.conftest import make_pool, running_worker
from tests.plans import plan_json


async def test_cancel_stops_the_agent_call_and_records_a_cancelled_trace(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings,
    trace_store: TraceStore,
) -> None:
    agent_server.script("conductor", [Reply.ok(plan_json(("gpt", "Think for a long time.", [])))])
    agent_server.script("gpt", [Reply.ok("too late").after(60)])
    task = Task(id=f"cancel-{uuid.uuid4().hex[:6]}", question="q", reference="42",
                options=RunOptions(agent_heartbeat_s=2))
    async with running_worker(client, settings, make_pool(agent_server)):
        wid = await conductor.submit(task)
        while agent_server.calls("gpt") == 0:
            await asyncio.sleep(0.1)
        started = time.monotonic()
        await conductor.cancel(wid, reason="changed my mind")
        with pytest.raises(RunFailed, match="cancel"):
            await conductor.result(wid)
        assert time.monotonic() - started < 10, "the cancel reaches the call via heartbeats"
        for _ in range(50):  # the server notices the closed connection on its next check
            if agent_server.requests("gpt")[-1].hung_up:
                break
            await asyncio.sleep(0.1)
        assert agent_server.requests("gpt")[-1].hung_up, "the HTTP request itself was dropped"

        trace = await trace_store.get(wid)
        assert trace is not None and trace.status == "cancelled"
        assert trace.error == "cancelled: changed my mind"
        assert trace.reward is not None and trace.reward.value == 0.0

        runs: list = []
        for _ in range(50):  # visibility is eventually consistent
            runs = await conductor.list(query=f'ConductorTask = "{task.id}"')
            if runs and runs[0].status == "canceled":
                break
            await asyncio.sleep(0.2)
        assert [(r.workflow_id, r.status) for r in runs] == [(wid, "canceled")]


async def _started(client: Client, workflow_id: str) -> bool:
    try:
        await client.get_workflow_handle(workflow_id).describe()
    except RPCError as e:
        assert "not found" in e.message.lower(), e.message
        return False
    return True


def _files(root: Path) -> set[Path]:
    return set(root.rglob("*")) if root.exists() else set()


async def test_a_task_that_cannot_be_stored_is_refused_before_anything_starts(
    conductor: ConductorClient, client: Client, settings: Settings,
) -> None:
    """No worker runs here: a run the client started would show in Temporal all the same."""
    unique = uuid.uuid4().hex[:6]
    good = Task(id=f"good-{unique}", question="q", reference="42")
    nul = good.model_copy(update={"id": f"nul-{unique}", "tags": ["ok", "a\x00b"]})
    with pytest.raises(ValueError) as e:
        await conductor.submit(nul)
    assert str(e.value) == ("field tags.1: holds a NUL character (U+0000) at character 1, "
                            "which PostgreSQL text cannot store; remove it")
    assert not await _started(client, workflow_id_for(nul))
    surrogate = good.model_copy(update={"id": f"sur-{unique}", "dataset": "d\ud800"})
    with pytest.raises(ValueError, match=r"^field dataset: holds a lone surrogate U\+D800 "):
        await conductor.submit(surrogate, workflow_id=f"named-{unique}")
    assert not await _started(client, f"named-{unique}")

    name = f"bad-{unique}"
    blobs = _files(settings.blobs_path)
    bad_id = good.model_copy(update={"id": f"x\x00{unique}"})
    with pytest.raises(ValueError) as e:
        await conductor.submit_batch(name, [good, bad_id])
    assert str(e.value) == ("field tasks.1.id: holds a NUL character (U+0000) at character "
                            "1, which PostgreSQL text cannot store; remove it")
    assert not await _started(client, batch_workflow_id(name))
    assert _files(settings.blobs_path) == blobs, "no task list was written either"
    assert not await _started(client, workflow_id_for(good))
