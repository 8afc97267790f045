"""The Python client API as a user scripts it: submit, result, cancel and list, on the real
Temporal dev server; a cancel reaches the agent call in flight and leaves a cancelled trace."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from temporalio.client import Client

from conductor_engine.engine.runtime.client import ConductorClient, RunFailed
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.trace_store import TraceStore
from conductor_engine.engine.tasks.model import RunOptions, Task
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
