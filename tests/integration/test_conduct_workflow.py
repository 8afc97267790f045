"""ConductWorkflow on the real Temporal dev server, with agents behind the real SDKs talking to
the scripted agent server: plans, DAG execution, retries, failures, self-calls, refinement."""

from __future__ import annotations

import json
import time

import pytest
from temporalio.client import Client

from conductor_engine.engine.contracts.tasks import RunOptions, Task
from conductor_engine.engine.settings import Settings
from conductor_engine.runtime.client import ConductorClient, RunFailed
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
    assert [s.sees for s in steps] == [[], [], [0, 1]]
    # steps 1 and 2 are independent, so both were scheduled before either finished: read from
    # the run's history, whatever the load (a wall-clock bound would fail on a busy machine)
    events = (await client.get_workflow_handle(res.workflow_id).fetch_history()).events
    scheduled = {e.event_id: json.loads(e.user_metadata.summary.data) for e in events
                 if e.HasField("activity_task_scheduled_event_attributes")}
    first_two = [i for i, summary in scheduled.items()
                 if summary.startswith(("step 1/3", "step 2/3"))]
    done = [e.event_id for e in events if e.HasField("activity_task_completed_event_attributes")
            and e.activity_task_completed_event_attributes.scheduled_event_id in first_two]
    assert len(first_two) == 2 and max(first_two) < min(done), \
        f"steps 1 and 2 should run in parallel ({elapsed:.2f}s)"
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


async def test_a_task_with_agents_plans_with_only_those_and_rejects_a_plan_naming_another(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings
) -> None:
    agent_server.script("conductor", [
        Reply.ok(plan_json(("gpt", "Answer.", []))),     # gpt is in the pool, not the task's
        Reply.ok(plan_json(("claude", "Answer.", []))),
    ])
    agent_server.script("claude", [Reply.ok("42")])
    async with running_worker(client, settings, make_pool(agent_server)):
        res = await conductor.run(Task(question="q", agents=["gemini", "claude"]))
    assert res.status == "completed" and res.answer == "42"
    first, second = res.rounds[0].attempts
    assert first.plan is None and "gpt" in (first.error or "")
    assert second.plan is not None and agent_server.calls("gpt") == 0
    system = agent_server.requests("conductor")[0].system
    assert "gpt" not in system and "OpenAI wire format" not in system
    assert system.index("Gemini wire format") < system.index("Anthropic wire format")
    assert set(second.agent_timeouts) == {"gemini", "claude"}


async def test_an_unknown_agent_in_a_tasks_agents_fails_the_run_once_with_one_clear_line(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings
) -> None:
    async with running_worker(client, settings, make_pool(agent_server)):
        with pytest.raises(RunFailed) as info:
            await conductor.run(Task(question="q", agents=["gpt", "mistral"]))
        history = await client.get_workflow_handle(info.value.workflow_id).fetch_history()
    reason = info.value.reason
    assert "'mistral', which this worker's pool does not have" in reason, reason
    assert "gpt, claude, gemini, conductor" in reason and "\n" not in reason
    assert agent_server.calls("conductor") == 0
    plans = [e for e in history.events if e.HasField("activity_task_started_event_attributes")
             and e.activity_task_started_event_attributes.attempt > 1]
    assert not plans, "a non-retryable error: one attempt"


def _nested_self_calls(prompt: str) -> str:
    """The parent: a note, a self-call that may read it, a comparison. The child: a step with
    no access, a deeper self-call and a step with access "all". The grandchild: one step."""
    if "Task:\nGo deeper." in prompt:
        return plan_json(("gpt", "Check 2^10.", []))
    if "Task:\nFind the two numbers." in prompt:
        return plan_json(("gemini", "Compute 2^10.", []), ("conductor", "Go deeper.", "all"),
                         ("claude", "Compute 10^3 and list both.", "all"))
    return plan_json(("gpt", "Note what ^ means.", []),
                     ("conductor", "Find the two numbers.", "all"), ("claude", "Compare.", "all"))


async def test_a_self_call_child_plans_and_works_knowing_the_original_question_and_context(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings
) -> None:
    question = "Which is larger, 2^10 or 10^3?"
    agent_server.set_responder("conductor", _nested_self_calls)
    agent_server.set_responder("gpt", lambda p: "checked" if "Check 2^10." in p
                               else "NOTE: ^ means power")
    agent_server.set_responder("gemini", lambda _: "2^10 = 1024")
    agent_server.set_responder("claude", lambda p: "1024 and 1000" if "Compute 10^3" in p
                               else "1024 is larger")
    async with running_worker(client, settings, make_pool(agent_server)):
        res = await conductor.run(Task(question=question))
    assert res.status == "completed" and res.answer == "1024 is larger"
    assert res.steps[1].child_workflow_id and res.steps[1].output == "1024 and 1000"

    plans = {r.text.split("Task:\n")[-1].split("\n")[0]: r.text
             for r in agent_server.requests("conductor")}
    child, grandchild = plans["Find the two numbers."], plans["Go deeper."]
    # the child's conductor: the overall job, then its background, then the part to plan
    assert child.index(question) < child.index("NOTE: ^ means power") < \
        child.index("Task:\nFind the two numbers.")
    # nested: the outermost question, and the background its "all" step could see
    assert f"The overall job (for context; plan only the task below, which is one part of " \
           f"it):\n{question}" in grandchild
    assert "NOTE: ^ means power" in grandchild and "2^10 = 1024" in grandchild

    gemini = agent_server.requests("gemini")[-1].text  # the child's step with access []
    assert question in gemini and "current part of the job:\nFind the two numbers." in gemini
    assert "NOTE: ^ means power" not in gemini, "no access: no parent context"
    [listing] = [r.text for r in agent_server.requests("claude") if "Compute 10^3" in r.text]
    assert question in listing and "NOTE: ^ means power" in listing and "2^10 = 1024" in listing
    checking = [r.text for r in agent_server.requests("gpt") if "Check 2^10." in r.text][-1]
    assert f"working on this job:\n{question}" in checking
    assert "current part of the job:\nGo deeper." in checking
    parent_gpt = [r.text for r in agent_server.requests("gpt") if "Note what" in r.text][-1]
    assert parent_gpt.startswith(f"You are one member of a team working on this task:\n"
                                 f"{question}"), "a user's task reads as before"
