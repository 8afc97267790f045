"""The plan activity picks the plan form from the conductor's `plan_form` (issue 18): the
schema and the prompt it sends, and the reply it parses, against the scripted agent server."""

from __future__ import annotations

import json
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from conductor_engine.activities.plan import PlanActivities
from conductor_engine.engine.contracts.activities import PlanRequest
from conductor_engine.engine.contracts.records import PlanAttempt
from conductor_engine.engine.contracts.tasks import RunOptions, Task
from conductor_engine.engine.providers.pool import Pool
from tests.agent_server import AgentServer


def pool(server: AgentServer, **conductor: Any) -> Pool:
    return Pool.model_validate({
        "conductor": {"id": "conductor", "provider": "openai-compatible", "model": "conductor",
                      "base_url": server.openai_base_url, **conductor},
        "offer_conductor_as_agent": False,
        "agents": [{"id": name, "provider": "sim", "model": "sim", "description": what}
                   for name, what in (("alpha", "Solves."), ("bravo", "Checks."))],
    })


async def plan(server: AgentServer, reply: str, **conductor: Any) -> PlanAttempt:
    server.reset()
    server.set_responder("conductor", lambda prompt: reply)
    task = Task(question="What is 6 x 7?", options=RunOptions(max_steps=2))
    activities = PlanActivities(pool(server, **conductor))
    return await ActivityEnvironment().run(activities.write_plan, PlanRequest(task=task))


REASONED = json.dumps({
    "reasoning": "1 checks what 0 solves.",
    "steps": [{"agent": "alpha", "subtask": "Compute 6 x 7.", "access": []},
              {"agent": 1, "subtask": "Check it and answer.", "access": ["all"]}],
})


async def test_the_default_conductor_is_asked_to_reason_first_and_its_plan_parses(
    agent_server: AgentServer,
) -> None:
    attempt = await plan(agent_server, REASONED, reasoning_max_chars=900)

    seen = agent_server.requests("conductor")[0]
    assert seen.json_schema is not None
    assert list(seen.json_schema["properties"]) == ["reasoning", "steps"]
    assert seen.json_schema["properties"]["reasoning"]["maxLength"] == 900
    step = seen.json_schema["properties"]["steps"]["prefixItems"][0]
    assert step["properties"]["subtask"]["maxLength"] == 2000  # RunOptions' default
    assert 'First think in "reasoning"' in seen.system and "at most 900 characters" in seen.system
    assert "0. alpha: Solves.\n1. bravo: Checks." in seen.system
    assert attempt.error is None and attempt.plan is not None
    assert [(s.agent, s.access) for s in attempt.plan.steps] == [("alpha", []), ("bravo", "all")]


async def test_a_bare_conductor_gets_the_steps_schema_alone(agent_server: AgentServer) -> None:
    attempt = await plan(agent_server, REASONED, plan_form="bare")

    seen = agent_server.requests("conductor")[0]
    assert seen.json_schema is not None and list(seen.json_schema["properties"]) == ["steps"]
    assert 'Reply with {"steps": [...]}, at most' in seen.system
    assert "reasoning" not in seen.system
    assert attempt.plan is not None and len(attempt.plan) == 2  # any reply form still parses


@pytest.mark.parametrize("plan_form", ["reasoning", "bare"])
async def test_a_free_text_conductor_thinks_then_writes_the_lists(
    agent_server: AgentServer, plan_form: str,
) -> None:
    reply = ("Bravo should check.\nmodel ids = [0, 1]\nsub tasks = ['Compute.', 'Check.']\n"
             "access list = [[], ['all']]")
    attempt = await plan(agent_server, reply, structured_output=False, plan_form=plan_form)

    seen = agent_server.requests("conductor")[0]
    assert seen.json_schema is None and "Think briefly about the task" in seen.system
    assert attempt.plan is not None
    assert [(s.agent, s.access) for s in attempt.plan.steps] == [("alpha", []), ("bravo", "all")]
