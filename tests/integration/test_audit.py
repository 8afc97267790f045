"""Audit trails from Temporal history and resuming failed runs, on the real Temporal dev server
and PostgreSQL: a resumed run calls no completed step's agent again, the trail read from history
alone agrees with the recorded trace, and the CLI does both."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from temporalio.client import Client

from conductor_engine.engine.contracts.tasks import RunOptions, Task
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.trace_store import TraceStore
from conductor_engine.runtime.client import ConductorClient, RunFailed
from conductor_engine.runtime.history import Trail, step_trail
from conductor_engine.runtime.resume import ResumeError, failed_runs, plan_resume, resume
from tests.agent_server import Reply
from tests.cli import one_line_error, run_conductor
from tests.conftest import make_pool, running_worker
from tests.plans import plan_json, self_calling_conductor

CHAIN = plan_json(
    ("gpt", "Compute 2^10.", []),
    ("claude", "Compute 10^3 and compare with step 1.", [0]),
    ("gemini", "Give the final answer.", "all"),
)



def _script_chain(agent_server, claude: list[Reply]) -> None:
    agent_server.script("conductor", [Reply.ok(CHAIN)])
    agent_server.script("gpt", [Reply.ok("2^10 = 1024")])
    agent_server.script("claude", claude)
    agent_server.script("gemini", [Reply.ok("Answer: 1024")])


async def _fail(conductor: ConductorClient, task: Task) -> str:
    with pytest.raises(RunFailed) as info:
        await conductor.run(task)
    return info.value.workflow_id


async def test_resume_redoes_the_failed_step_and_calls_no_completed_step_again(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings,
    trace_store: TraceStore,
) -> None:
    _script_chain(agent_server, [Reply.error(401, "invalid x-api-key")])
    async with running_worker(client, settings, make_pool(agent_server)):
        with pytest.raises(RunFailed, match=r"step 2/3 \(claude\) failed: .*401") as info:
            await conductor.run(Task(question="Which is larger, 2^10 or 10^3?"))
        wid = info.value.workflow_id
        failed_run = (await step_trail(client, wid)).run_id

        plan = await plan_resume(client, wid)
        assert plan.status == "failed" and plan.run_id == failed_run
        assert plan.failed is not None and plan.failed.label() == "round 1 · step 2 (claude)"
        assert [i.label() for i in plan.kept] == ["round 1 · plan attempt 1",
                                                  "round 1 · step 1 (gpt)"]
        assert [(i.label(), i.why) for i in plan.redone] == [
            ("round 1 · step 2 (claude)", plan.redone[0].why),
            ("round 1 · step 3 (gemini)", "not run yet")]
        assert "401" in (plan.redone[0].why or "")
        trail = await step_trail(client, wid)
        claude_step = trail.steps[1]
        assert plan.reset_event_id == claude_step.scheduled_by_event_id  # a chain: nothing else ran
        assert f"--event-id {plan.reset_event_id}" in plan.command

        agent_server.script("claude", [Reply.ok("10^3 = 1000, so 2^10 is larger")])
        new_run = await resume(client, plan)
        with pytest.raises(ResumeError, match="has a newer run"):
            await resume(client, plan)  # a second reset of the old run would end the new one
        res = await conductor.result(wid)

    assert new_run != failed_run and res.run_id == new_run
    assert res.status == "completed" and res.answer == "Answer: 1024"
    assert agent_server.calls("gpt") == 1, "step 1 completed before the failure: never re-called"
    assert agent_server.calls("conductor") == 1, "the plan is kept too"
    assert agent_server.calls("claude") == 2 and agent_server.calls("gemini") == 1
    assert [s.output for s in res.steps][0] == "2^10 = 1024"
    trace = await trace_store.get(wid)
    assert trace is not None and trace.run_id == new_run and trace.status == "completed"
    resumed = await step_trail(client, wid)
    assert resumed.reset is not None and resumed.reset.base_run_id == failed_run
    with pytest.raises(ResumeError, match=f"run {wid} is completed; nothing to resume"):
        await plan_resume(client, wid)


async def test_a_parallel_step_that_finished_while_the_failed_one_ran_is_kept(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings,
) -> None:
    agent_server.script("conductor", [Reply.ok(plan_json(
        ("gpt", "Work out 2^10.", []),
        ("claude", "Work out 10^3.", []),
        ("gemini", "Say which is larger.", [0, 1]),
    ))])
    agent_server.script("gpt", [Reply.ok("1024")])
    agent_server.script("claude", [Reply.error(401, "invalid x-api-key").after(1.0)])
    agent_server.script("gemini", [Reply.ok("1024 is larger")])
    async with running_worker(client, settings, make_pool(agent_server)):
        wid = await _fail(conductor, Task(question="Which is larger?"))
        plan = await plan_resume(client, wid)
        trail = await step_trail(client, wid)
        gpt_step, claude_step = trail.steps[0], trail.steps[1]
        # both were scheduled together; gpt's answer came while claude was still running
        assert gpt_step.scheduled_by_event_id == claude_step.scheduled_by_event_id
        assert plan.reset_event_id > (gpt_step.closed_event_id or 0)
        assert [i.label() for i in plan.kept] == ["round 1 · plan attempt 1",
                                                  "round 1 · step 1 (gpt)"]
        assert [i.label() for i in plan.redone] == ["round 1 · step 2 (claude)",
                                                    "round 1 · step 3 (gemini)"]
        agent_server.script("claude", [Reply.ok("1000")])
        await resume(client, plan)
        res = await conductor.result(wid)
    assert res.answer == "1024 is larger"
    assert agent_server.calls("gpt") == 1 and agent_server.calls("claude") == 2


async def test_the_trail_from_history_matches_the_recorded_trace(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings,
    trace_store: TraceStore,
) -> None:
    _script_chain(agent_server, [Reply.error(429, "slow down", retry_after=0.1),
                                 Reply.ok("10^3 = 1000", input_tokens=40, output_tokens=6)])
    async with running_worker(client, settings, make_pool(agent_server)):
        res = await conductor.run(Task(question="Which is larger, 2^10 or 10^3?",
                                       reference="1024"))
    trail = await step_trail(client, res.workflow_id)
    trace = await trace_store.get(res.workflow_id)
    assert trace is not None and trail.run_id == trace.run_id
    assert trail.status == "completed" and trail.run_status == trace.status == "completed"
    assert trail.task is not None and trail.task.question == trace.task.question
    fields = ("agent", "subtask", "sees", "output", "usage", "attempts")
    assert [[getattr(s, f) for f in fields] for s in trail.steps] == [
        [getattr(s, f) for f in fields] for s in trace.steps]
    assert trail.steps[1].attempts == 2 and trail.steps[1].usage.output_tokens == 6
    assert [e.message for e in trail.steps[1].errors] == [
        "agent claude: rate limited (HTTP 429): slow down; will be retried"]
    assert trail.steps[2].seen[1].output == "10^3 = 1000"
    assert trail.answer == trace.answer and trail.reward == trace.reward
    assert trail.reward is not None and trail.reward.value == 1.0
    assert trail.usage == trace.totals.usage
    assert trail.cost_usd == pytest.approx(trace.totals.cost_usd)
    [attempt] = trail.plan_attempts
    assert attempt.raw_text == CHAIN and attempt.plan == trace.rounds[0].plan


async def test_a_failed_step_shows_the_error_of_each_attempt(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings,
) -> None:
    _script_chain(agent_server, [Reply.error(429, "slow down", retry_after=0.1),
                                 Reply.error(401, "invalid x-api-key")])
    async with running_worker(client, settings, make_pool(agent_server)):
        wid = await _fail(conductor, Task(question="q"))
    trail = await step_trail(client, wid)
    assert trail.status == "failed" and "step 2/3 (claude) failed" in (trail.error or "")
    step1, step2, step3 = trail.steps
    assert step1.status == "done" and step3.status == "pending" and step3.sees == [0, 1]
    assert step2.status == "failed" and step2.attempts == 2
    assert [(e.attempt, e.non_retryable) for e in step2.errors] == [(1, False), (2, True)]
    assert "429" in step2.errors[0].message and "401" in step2.errors[1].message
    assert "TEST_ANTHROPIC_KEY" in step2.errors[1].message
    assert step2.seen[0].output == "2^10 = 1024" and step2.sees == [0]


async def test_a_running_run_shows_live_attempts_and_a_terminated_one_resumes(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings,
) -> None:
    _script_chain(agent_server, [Reply.error(503, "overloaded")])
    options = RunOptions(max_step_attempts=100)
    async with running_worker(client, settings, make_pool(agent_server)):
        wid = await conductor.submit(Task(question="q", options=options))
        deadline = time.monotonic() + 10
        while agent_server.calls("claude") < 2:
            assert time.monotonic() < deadline, "claude was not retried"
            await asyncio.sleep(0.1)
        trail = await step_trail(client, wid)
        assert trail.status == "running" and trail.run_status is None
        step1, step2, step3 = trail.steps
        assert (step1.status, step2.status, step3.status) == ("done", "running", "pending")
        assert step2.attempts >= 2 and "HTTP 503" in step2.errors[-1].message
        with pytest.raises(ResumeError, match=f"run {wid} is still running; nothing to resume"):
            await plan_resume(client, wid)

        await client.get_workflow_handle(wid).terminate(reason="stuck on claude")
        plan = await plan_resume(client, wid)
        assert plan.status == "terminated" and plan.failed is None
        assert plan.error == "terminated: stuck on claude"
        assert [i.label() for i in plan.kept] == ["round 1 · plan attempt 1",
                                                  "round 1 · step 1 (gpt)"]
        assert [i.why for i in plan.redone] == ["was running when the run ended", "not run yet"]
        agent_server.script("claude", [Reply.ok("1000")])
        await resume(client, plan)
        res = await conductor.result(wid)
    assert res.status == "completed" and agent_server.calls("gpt") == 1


async def test_a_self_call_step_is_its_child_workflow_answer(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings,
    trace_store: TraceStore,
) -> None:
    agent_server.set_responder("conductor", self_calling_conductor)
    agent_server.script("gpt", [Reply.ok("1024 and 1000")])
    agent_server.script("claude", [Reply.ok("1024 is larger")])
    async with running_worker(client, settings, make_pool(agent_server)):
        res = await conductor.run(Task(question="Which is larger?"))
    trail = await step_trail(client, res.workflow_id)
    trace = await trace_store.get(res.workflow_id)
    assert trace is not None
    step = trail.steps[0]
    assert step.child_workflow_id and trail.self_calls == [step.child_workflow_id]
    assert step.status == "done" and step.question == "Which is larger?"
    fields = ("agent", "output", "usage", "attempts", "child_workflow_id", "sees")
    assert [[getattr(s, f) for f in fields] for s in trail.steps] == [
        [getattr(s, f) for f in fields] for s in trace.steps]
    child = await step_trail(client, step.child_workflow_id)
    assert [s.agent for s in child.steps] == ["gpt"] and child.answer == "1024 and 1000"


def _env(settings: Settings) -> dict[str, str]:
    return {"CONDUCTOR_TEMPORAL_ADDRESS": settings.address,
            "CONDUCTOR_DATA_DIR": str(settings.data_dir),
            "CONDUCTOR_DATABASE_URL": settings.database_url or "",
            "CONDUCTOR_UI_URL": settings.ui_url or ""}


async def test_cli_history_and_resume(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings,
) -> None:
    _script_chain(agent_server, [Reply.error(401, "invalid x-api-key")])
    env = _env(settings)
    async with running_worker(client, settings, make_pool(agent_server)):
        wid = await _fail(conductor, Task(question="q"))
        shown = await asyncio.to_thread(run_conductor, "history", wid, "--json", env=env)
        assert shown.returncode == 0, shown.stderr
        trail = Trail.model_validate_json(shown.stdout)
        assert trail.status == "failed" and [s.status for s in trail.steps] == [
            "done", "failed", "pending"]
        table = await asyncio.to_thread(run_conductor, "history", wid, env=env)
        assert "invalid x-api-key" in table.stdout and "Compute 10^3" in table.stdout

        agent_server.script("claude", [Reply.ok("1000")])
        declined = await asyncio.to_thread(run_conductor, "resume", wid, env=env, stdin="n\n")
        assert declined.returncode == 1 and "Reset 1 run(s)?" in declined.stdout
        assert (await step_trail(client, wid)).run_id == trail.run_id, "nothing was reset"
        proc = await asyncio.to_thread(run_conductor, "resume", wid, "--yes", env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "kept" in proc.stdout and "step 1 (gpt)" in proc.stdout
        assert f"temporal workflow reset --namespace default --workflow-id {wid}" in proc.stdout
        res = await conductor.result(wid)
    assert res.status == "completed" and res.run_id in proc.stdout
    assert settings.workflow_url(wid, res.run_id) in proc.stdout
    assert agent_server.calls("gpt") == 1
    again = await asyncio.to_thread(run_conductor, "resume", wid, "--yes", env=env)
    assert one_line_error(again) == f"error: run {wid} is completed; nothing to resume"


async def test_resume_a_batch_resets_its_failed_runs(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings,
) -> None:
    batch = f"b-{uuid.uuid4().hex[:8]}"
    _script_chain(agent_server, [Reply.error(401, "invalid x-api-key")])
    env = _env(settings)
    async with running_worker(client, settings, make_pool(agent_server)):
        failed = sorted([await _fail(conductor, Task(question=f"q{i}", batch=batch))
                         for i in range(2)])
        await _fail(conductor, Task(question="another batch", batch=f"{batch}-x"))
        deadline = time.monotonic() + 10
        while (found := sorted(await failed_runs(client, batch))) != failed:
            assert time.monotonic() < deadline, f"visibility shows {found}, not {failed}"
            await asyncio.sleep(0.3)

        agent_server.script("claude", [Reply.ok("1000")])
        proc = await asyncio.to_thread(run_conductor, "resume", "--batch", batch, "--yes",
                                       env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        results = [await conductor.result(wid) for wid in failed]
    assert all(r.status == "completed" for r in results)
    assert agent_server.calls("gpt") == 3, "one call per run, none again on resume"
    assert await failed_runs(client, batch) == []
