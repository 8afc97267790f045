"""Two workers with different pools on one Temporal, on the same queue settings (two `conductor
up` with different `--pool` files): each pool has its own task queue, so every run is served by
a worker that has its agents, and none fails for an agent its worker does not know."""

from __future__ import annotations

import uuid
from typing import Any

from temporalio.client import Client

from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.trace_store import TraceStore
from conductor_engine.runtime.client import (
    ConductorClient,
    connect_temporal,
    task_queue_of,
)
from tests.batches import wait_done
from tests.conftest import make_pool, running_worker
from tests.plans import plan_json

TASKS = 16


def _pool(server: Any, agent: str) -> Pool:
    """The scripted conductor delegating to one sim agent named `agent`, always right."""
    return Pool.model_validate({
        "conductor": make_pool(server).conductor.model_dump(),
        "offer_conductor_as_agent": False,
        "agents": [{"id": agent, "provider": "sim", "model": "sim", "description": "a helper",
                    "sim": {"default_skill": 1.0, "output_tokens": 5}}],
    })


def _conductor(prompt: str) -> str:
    """A plan for the one agent the prompt's pool lists: the plan activity ran on a worker of
    the run's own pool exactly when it names that pool's agent."""
    return plan_json(("alpha" if "alpha" in prompt else "bravo", "Answer it.", []))


async def test_two_workers_with_different_pools_each_complete_their_own_batch(
    agent_server: Any, client: Client, settings: Settings, trace_store: TraceStore,
) -> None:
    agent_server.set_responder("conductor", _conductor)
    pools = {"alpha": _pool(agent_server, "alpha"), "bravo": _pool(agent_server, "bravo")}
    both = {agent: settings.model_copy() for agent in pools}  # one queue stem, two pools
    assert task_queue_of(both["alpha"], pools["alpha"]) != task_queue_of(both["bravo"],
                                                                          pools["bravo"])
    other = await connect_temporal(settings, start_embedded=False)  # a second process's own
    async with running_worker(client, both["alpha"], pools["alpha"]), \
            running_worker(other, both["bravo"], pools["bravo"]):
        names = {}
        for agent, pool in pools.items():
            conductor = ConductorClient(client, both[agent])
            assert conductor.task_queue == task_queue_of(both[agent], pool)
            name = f"{agent}-{uuid.uuid4().hex[:6]}"
            tasks = [Task(id=f"{name}-{i}", question=f"What is {i} + 1?", reference=str(i + 1),
                          verifier="math") for i in range(TASKS)]
            _, started = await conductor.submit_batch(name, tasks, concurrency=TASKS,
                                                      report=False)
            assert started
            names[agent] = (conductor, name)
        for agent, (conductor, name) in names.items():
            await wait_done(conductor, name, timeout=180)
            status, progress = await conductor.batch_progress(name)
            assert status == "completed" and progress is not None, (agent, status)
            assert (progress.completed, progress.failed) == (TASKS, 0), (agent, progress)
    for agent, (_, name) in names.items():
        traces = await trace_store.batch_traces(name, resolve_blobs=False)
        assert len(traces) == TASKS
        for trace in traces:
            assert [s.agent for r in trace.rounds for s in r.steps] == [agent], trace.rounds
            assert trace.status == "completed" and trace.reward is not None
            assert trace.reward.value == 1.0
