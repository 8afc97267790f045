"""ConductWorkflow on the real Temporal dev server, with agents behind the real SDKs talking to
the scripted agent server: plans, DAG execution, retries, failures, self-calls, refinement."""

from __future__ import annotations

import json
import time

import pytest
from temporalio.client import Client

from conductor_engine.engine.runtime.client import ConductorClient, RunFailed
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.tasks.model import RunOptions, Task
from tests.agent_server import Reply
from tests.conftest import make_pool, running_worker
from tests.plans import plan_json, self_calling_conductor


async def test_plan_runs_as_a_dag_with_independent_steps_in_parallel(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings
) -> None:
    agent_server.script("conductor", [Reply.ok(plan_json(
        ("gpt", "Work out 2^10.", []),
        ("claude", "Work out 10^3.", []),
        ("gemini", "Say which is larger.", [0, 1]),
    ))])
    agent_server.script("gpt", [Reply.ok("2^10 = 1024").after(1.0)])
    agent_server.script("claude", [Reply.ok("10^3 = 1000").after(1.0)])
    agent_server.script("gemini", [Reply.ok("1024 is larger", input_tokens=50, output_tokens=7)])
    async with running_worker(client, settings, make_pool(agent_server)):
        started = time.monotonic()
        res = await conductor.run(Task(question="Which is larger, 2^10 or 10^3?"))
        elapsed = time.monotonic() - started
        # a query (even of a closed run) needs a worker
        handle = client.get_workflow_handle(res.workflow_id)
        details = (await handle.query("__temporal_workflow_metadata")).current_details

    assert res.status == "completed" and res.answer == "1024 is larger"
    steps = res.steps
    assert [s.agent for s in steps] == ["gpt", "claude", "gemini"]
    assert [s.saw for s in steps] == [[], [], [0, 1]]
    assert elapsed < 1.9, f"steps 1 and 2 are independent and should overlap ({elapsed:.2f}s)"
    final_prompt = agent_server.requests("gemini")[-1].text
    assert "2^10 = 1024" in final_prompt and "10^3 = 1000" in final_prompt
    assert "Say which is larger." in final_prompt
    assert "2^10 = 1024" not in agent_server.requests("claude")[-1].text  # access [] respected
    assert steps[2].usage.output_tokens == 7 and res.totals.agent_calls == 3
    assert all(s.attempts == 1 for s in steps)
    assert res.totals.cost_usd > 0  # gpt has a price in the test pool

    # what the Temporal UI shows: a summary on every activity, a details table on the run
    summaries = [
        json.loads(e.user_metadata.summary.data)
        for e in (await handle.fetch_history()).events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert summaries[0].startswith("plan · round 1 · attempt 1 · Which is larger")
    assert "step 3/3 · gemini · Say which is larger." in summaries
    desc = await handle.describe()
    assert await desc.static_summary() == "Which is larger, 2^10 or 10^3?"
    assert "| 3 | gemini | Say which is larger. | 1,2 | done |" in details


async def test_unparseable_plans_are_retried_then_the_run_completes_with_the_raw_text(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings
) -> None:
    agent_server.script("conductor", [Reply.ok("I would simply answer 1024.")])
    async with running_worker(client, settings, make_pool(agent_server)):
        res = await conductor.run(Task(question="q", options=RunOptions(max_plan_attempts=3)))

    assert res.status == "invalid_plan" and res.answer is None
    attempts = res.rounds[0].attempts
    assert len(attempts) == 3 and agent_server.calls("conductor") == 3
    assert all(a.raw_text == "I would simply answer 1024." for a in attempts)
    assert "no plan found" in (res.error or "")
    # the conductor is told why its previous reply was rejected
    assert "not a valid plan: no plan found" in agent_server.requests("conductor")[-1].text


async def test_an_invalid_plan_then_a_valid_one_completes(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings
) -> None:
    agent_server.script("conductor", [
        Reply.ok(plan_json(("gpt", "a", [3]))),
        Reply.ok(plan_json(("gpt", "Answer.", []))),
    ])
    agent_server.script("gpt", [Reply.ok("42")])
    async with running_worker(client, settings, make_pool(agent_server)):
        res = await conductor.run(Task(question="q"))
    assert res.status == "completed" and res.answer == "42"
    first, second = res.rounds[0].attempts
    assert first.plan is None and "not earlier steps" in (first.error or "")
    assert second.plan is not None


async def test_429_is_retried_after_the_retry_after_delay(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings
) -> None:
    agent_server.script("conductor", [Reply.ok(plan_json(("claude", "Answer.", [])))])
    agent_server.script("claude", [
        Reply.error(429, "slow down", retry_after=3),
        Reply.ok("done"),
    ])
    async with running_worker(client, settings, make_pool(agent_server)):
        started = time.monotonic()
        res = await conductor.run(Task(question="q"))
        elapsed = time.monotonic() - started
    assert res.answer == "done" and res.steps[0].attempts == 2
    assert agent_server.calls("claude") == 2
    assert elapsed >= 3.0, "the retry must wait for Retry-After (3s), not the 1s back-off"


async def test_401_fails_the_run_at_once_naming_the_variable_to_set(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings
) -> None:
    agent_server.script("conductor", [Reply.ok(plan_json(
        ("gpt", "Draft.", []), ("gemini", "Finish.", "all")))])
    agent_server.script("gpt", [Reply.ok("draft")])
    agent_server.script("gemini", [Reply.error(401, "API key not valid")])
    async with running_worker(client, settings, make_pool(agent_server)):
        with pytest.raises(RunFailed) as info:
            await conductor.run(Task(question="q"))
    message = str(info.value)
    assert "step 2/2 (gemini)" in message and "TEST_GEMINI_KEY" in message
    assert agent_server.calls("gemini") == 1, "an auth error is not retried"
    assert "sk-test" not in message


async def test_a_hung_agent_times_out_and_is_retried(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings
) -> None:
    agent_server.script("conductor", [Reply.ok(plan_json(("gpt", "Answer.", [])))])
    agent_server.script("gpt", [Reply.ok("late").after(5.0), Reply.ok("on time")])
    pool = make_pool(agent_server, gpt={"timeout_s": 1.0})
    async with running_worker(client, settings, pool):
        res = await conductor.run(Task(question="q"))
    assert res.answer == "on time" and res.steps[0].attempts == 2


async def test_a_hung_agent_is_bounded_by_the_step_deadline(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings
) -> None:
    agent_server.script("conductor", [Reply.ok(plan_json(("gpt", "Answer.", [])))])
    agent_server.script("gpt", [Reply.ok("never").after(30.0)])
    pool = make_pool(agent_server, gpt={"timeout_s": 1.0})
    options = RunOptions(step_deadline_s=3.5, max_step_attempts=100)
    async with running_worker(client, settings, pool):
        started = time.monotonic()
        with pytest.raises(RunFailed, match=r"step 1/1 \(gpt\) failed: .*timed out"):
            await conductor.run(Task(question="q", options=options))
    assert time.monotonic() - started < 15
    assert 2 <= agent_server.calls("gpt") <= 4


async def test_a_step_given_to_the_conductor_runs_as_a_child_workflow(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings
) -> None:
    agent_server.set_responder("conductor", self_calling_conductor)
    agent_server.script("gpt", [Reply.ok("1024 and 1000")])
    agent_server.script("claude", [Reply.ok("1024 is larger")])
    async with running_worker(client, settings, make_pool(agent_server)):
        res = await conductor.run(Task(question="Which is larger?"))
    step = res.steps[0]
    assert step.child_workflow_id and step.output == "1024 and 1000"
    child = client.get_workflow_handle(step.child_workflow_id)
    assert (await child.describe()).status.name == "COMPLETED"
    assert "1024 and 1000" in agent_server.requests("claude")[-1].text
    assert agent_server.calls("conductor") == 2  # the parent's plan and the child's


async def test_self_calls_beyond_the_depth_limit_call_the_conductor_model_directly(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings
) -> None:
    agent_server.set_responder("conductor", lambda p: (
        "a direct answer" if "Your subtask:" in p else plan_json(("conductor", "Solve it.", []))))
    async with running_worker(client, settings, make_pool(agent_server)):
        res = await conductor.run(Task(question="q", options=RunOptions(self_call_depth=0)))
    assert res.answer == "a direct answer" and res.steps[0].child_workflow_id is None


async def test_refinement_rounds_see_the_last_plan_and_stop_on_an_empty_plan(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings
) -> None:
    agent_server.script("conductor", [
        Reply.ok(plan_json(("gpt", "First try.", []))),
        Reply.ok(plan_json(("claude", "Fix the answer.", []))),
        Reply.ok('{"steps": []}'),
    ])
    agent_server.script("gpt", [Reply.ok("999")])
    agent_server.script("claude", [Reply.ok("1024")])
    async with running_worker(client, settings, make_pool(agent_server)):
        res = await conductor.run(Task(question="q", options=RunOptions(refinement_rounds=3)))
    assert res.answer == "1024" and len(res.rounds) == 3
    assert res.rounds[2].plan is not None and not res.rounds[2].plan.steps
    second_prompt = agent_server.requests("conductor")[1].text
    assert "First try." in second_prompt and "999" in second_prompt


async def test_a_conductor_that_cannot_be_called_fails_the_run_with_the_reason(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings
) -> None:
    agent_server.script("conductor", [Reply.error(404, "model 'conductor' not found")])
    async with running_worker(client, settings, make_pool(agent_server)):
        with pytest.raises(RunFailed, match=r"planning round 1 failed: .*conductor.*not found"):
            await conductor.run(Task(question="q"))
    assert agent_server.calls("conductor") == 1, "a 404 is not retried"
