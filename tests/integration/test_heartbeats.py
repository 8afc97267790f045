"""Long activities heartbeat, on the real Temporal dev server: a plan whose conductor answers
slowly is seen beating in the workflow's pending activities, under the run's heartbeat timeout,
so a worker that dies mid-plan is noticed within seconds rather than the plan timeout."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime

from temporalio.client import Client

from conductor_engine.engine.contracts.names import PLAN_ACTIVITY
from conductor_engine.engine.contracts.tasks import RunOptions, Task
from conductor_engine.engine.settings import Settings
from conductor_engine.runtime.client import ConductorClient
from tests.agent_server import Reply
from tests.conftest import make_pool, running_worker
from tests.plans import plan_json


async def test_a_slow_plan_heartbeats_while_the_conductor_thinks(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings,
) -> None:
    agent_server.script("conductor", [Reply.ok(plan_json(("gpt", "Compute 2^10.", []))).after(6)])
    agent_server.script("gpt", [Reply.ok("1024")])
    task = Task(question="What is 2^10?", options=RunOptions(agent_heartbeat_s=2))
    async with running_worker(client, settings, make_pool(agent_server)):
        wid = await conductor.submit(task)
        handle = client.get_workflow_handle(wid)
        beats: set[datetime] = set()
        deadline = time.monotonic() + 60  # a safety net; the plan takes about 6 s
        while time.monotonic() < deadline:
            desc = await handle.describe()
            planning = [a for a in desc.raw_description.pending_activities
                        if a.activity_type.name == PLAN_ACTIVITY]
            if not planning and beats:
                break  # the plan came back
            for a in planning:
                if a.HasField("last_heartbeat_time"):
                    beats.add(a.last_heartbeat_time.ToDatetime())
            await asyncio.sleep(0.2)
        result = await conductor.result(wid)
        history = await handle.fetch_history()
    timeouts = {
        e.activity_task_scheduled_event_attributes.heartbeat_timeout.ToTimedelta().total_seconds()
        for e in history.events if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == PLAN_ACTIVITY
    }
    assert timeouts == {2.0}, "the plan activity is scheduled with the run's heartbeat timeout"
    assert len(beats) >= 2, "the plan activity kept heartbeating while the conductor thought"
    assert result.answer == "1024"
