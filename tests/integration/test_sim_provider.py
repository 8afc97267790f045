"""The sim provider: repeatable right/wrong answers drawn from a skill matrix, scored by the real
verifiers, with latency and usage as configured; the pool rules for sim agents; and a run of
ConductWorkflow on the real Temporal dev server whose steps are sim agents."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

from conductor_engine.activities.agent import AgentActivities
from conductor_engine.engine.contracts.activities import AgentCallInput
from conductor_engine.engine.contracts.tasks import RolloutSampling, Task
from conductor_engine.engine.providers import CompletionRequest, Message, TaskInfo, complete
from conductor_engine.engine.providers import sim as sim_provider
from conductor_engine.engine.providers.pool import AgentSpec, Pool, PoolError, SimSettings
from conductor_engine.engine.rewards import score_run
from conductor_engine.engine.rewards.verifiers import answer_key
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.trace_store import TraceStore
from conductor_engine.engine.tasks.files import load_tasks
from conductor_engine.runtime.client import ConductorClient
from tests.conftest import make_pool, running_worker
from tests.plans import plan_json

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "sim"


def sim_agent(agent_id: str = "alpha", **settings: Any) -> AgentSpec:
    return AgentSpec(id=agent_id, provider="sim", model="sim", sim=SimSettings(**settings))


def request(task: TaskInfo | None, prompt: str = "Your subtask: answer.") -> CompletionRequest:
    return CompletionRequest(messages=[Message(role="user", content=prompt)], task=task)


def info(task_id: str = "t1", reference: str | None = "42", *, tags: list[str] | None = None,
         verifier: str | None = None, sample: int = 0, attempt: int = 1) -> TaskInfo:
    """A call's TaskInfo as the agent activity gives a sim agent: with the verifier's reading
    of the reference (`key`)."""
    return TaskInfo(task_id=task_id, tags=["math"] if tags is None else tags,
                    reference=reference, verifier=verifier, sample=sample, attempt=attempt,
                    key=answer_key(reference, verifier) if reference else None)


async def answer(spec: AgentSpec, task: TaskInfo | None) -> str:
    return (await complete(spec, request(task))).text


# --- answers ------------------------------------------------------------------------------


async def test_the_same_task_agent_sample_and_attempt_always_get_the_same_answer() -> None:
    spec = sim_agent(skills={"math": 0.5})
    first = [await answer(spec, info(sample=s)) for s in range(40)]
    again = [await answer(spec, info(sample=s)) for s in range(40)]
    assert first == again
    assert {"42", "43"} == set(first), "samples of a group draw independently: both outcomes"
    # each part of the key moves the draw: another agent, task or attempt answers differently
    others = [
        [await answer(sim_agent("bravo", skills={"math": 0.5}), info(sample=s)) for s in range(40)],
        [await answer(spec, info("t2", sample=s)) for s in range(40)],
        [await answer(spec, info(sample=s, attempt=2)) for s in range(40)],
    ]
    assert all(o != first for o in others)


@pytest.mark.parametrize("skill", [0.1, 0.5, 0.95])
def test_the_share_of_right_answers_over_many_samples_matches_the_skill(skill: float) -> None:
    spec = sim_agent(skills={"math": skill})
    assert spec.sim is not None
    n = 4000
    right = sum(sim_provider.is_right(spec, spec.sim, info(sample=s)) for s in range(n))
    assert abs(right / n - skill) < 0.025  # about 3 standard errors at p = 0.5


def test_a_task_gets_the_best_skill_of_its_tags_and_the_default_when_none_is_listed() -> None:
    s = SimSettings(skills={"math": 0.9, "Code": 0.2}, default_skill=0.3)
    assert s.skill(["code", "math"]) == 0.9
    assert s.skill(["CODE"]) == 0.2, "tags match case-insensitively"
    assert s.skill(["poetry", "code"]) == 0.2, "an unlisted tag does not pull the default in"
    assert s.skill(["poetry"]) == 0.3 and s.skill([]) == 0.3
    assert SimSettings().skill(["math"]) == 0.5


async def test_skill_one_is_always_right_and_zero_always_wrong() -> None:
    sure, hopeless = sim_agent(skills={"math": 1.0}), sim_agent(skills={"math": 0.0})
    assert {await answer(sure, info(sample=s)) for s in range(50)} == {"42"}
    assert {await answer(hopeless, info(sample=s)) for s in range(50)} == {"43"}
    unlisted = sim_agent(skills={"math": 1.0}, default_skill=0.0)
    assert await answer(unlisted, info(tags=["history"])) == "43"


@pytest.mark.parametrize(("reference", "verifier"), [
    ("42", "math"), ("-3.5", None), ("1,000", None), ("x^2+1", None), ("(1, 2)", "math"),
    ("\\frac{1}{2}", None), ("B", None), ("(C)", "choice"), ("Paris", "exact"),
    ("2021-12-25", None), ("I", None),
])
async def test_right_answers_score_1_and_wrong_answers_score_half_with_the_real_verifiers(
    reference: str, verifier: str | None
) -> None:
    task = info(reference=reference, verifier=verifier)
    right = await answer(sim_agent(skills={"math": 1.0}), task)
    wrong = await answer(sim_agent(skills={"math": 0.0}), task)
    assert score_run("completed", right, reference, verifier).value == 1.0
    graded = score_run("completed", wrong, reference, verifier)
    assert graded.value == 0.5 and graded.reason.startswith("wrong"), graded.reason


async def test_a_call_without_a_task_or_reference_gets_a_neutral_answer() -> None:
    spec = sim_agent(skills={"math": 1.0})
    for task in (None, info(reference=None), info(reference="  ")):
        text = await answer(spec, task)
        assert "simulated" in text and "alpha" in text


# --- latency and usage --------------------------------------------------------------------


async def test_latency_is_honoured_and_repeatable_and_a_cancel_stops_the_wait() -> None:
    spec = sim_agent(latency_s=0.3)
    started = time.monotonic()
    await complete(spec, request(info()))
    assert 0.3 <= time.monotonic() - started < 10, "waits its latency (the bound: a safety net)"

    jittery = sim_agent(latency_s=1.0, latency_jitter_s=2.0)
    assert jittery.sim is not None
    waits = [sim_provider.latency(jittery, jittery.sim, info(sample=s)) for s in range(50)]
    assert all(1.0 <= w <= 3.0 for w in waits) and len(set(waits)) > 40
    assert waits == [sim_provider.latency(jittery, jittery.sim, info(sample=s)) for s in range(50)]

    call = asyncio.create_task(complete(sim_agent(latency_s=30.0), request(info())))
    await asyncio.sleep(0.1)
    started = time.monotonic()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert time.monotonic() - started < 10, "stopped waiting, far short of its 30 s latency"


async def test_usage_follows_the_settings_and_cost_the_pool_prices() -> None:
    spec = sim_agent(output_tokens=300, input_tokens_per_char=0.5).model_copy(
        update={"price_input_per_mtok": 2.0, "price_output_per_mtok": 10.0})
    done = await complete(spec, request(info(), prompt="x" * 1000))
    assert done.usage.input_tokens == 500 and done.usage.output_tokens == 300
    assert done.cost_usd == pytest.approx((500 * 2.0 + 300 * 10.0) / 1e6)
    assert done.model == "sim" and done.finish_reason == "stop"
    capped = await complete(spec, request(info()).model_copy(update={"max_tokens": 64}))
    assert capped.usage.output_tokens == 64, "a call never reports more than its max_tokens"


async def test_the_agent_activity_passes_the_task_and_its_attempt_to_the_sim_agent() -> None:
    pool = Pool.model_validate({
        "conductor": {"id": "conductor", "provider": "local", "model": "m"},
        "agents": [{"id": "alpha", "provider": "sim", "model": "sim",
                    "sim": {"skills": {"math": 0.5}}}],
    })
    spec = pool.get("alpha")
    env = ActivityEnvironment()
    by_attempt = {}
    for attempt in (1, 2, 3, 4, 5, 6):
        # each attempt as one that follows a failed call (a separate activity id here: an
        # answer a worker received is stashed for a retry of the same activity, stashed_answers.py)
        env.info = dataclasses.replace(env.info, attempt=attempt, activity_id=f"a{attempt}")
        reply = await env.run(AgentActivities(pool).call_agent, AgentCallInput(
            agent="alpha", question="q", subtask="s", task=info(attempt=1)))
        assert reply.attempt == attempt
        assert reply.output == await answer(spec, info(attempt=attempt))
        by_attempt[attempt] = reply.output
    assert len(set(by_attempt.values())) == 2, "a retried step draws again"
    # an input recorded before the field existed still decodes, and gets a neutral answer
    old = AgentCallInput.model_validate({"agent": "alpha", "question": "q", "subtask": "s"})
    assert old.task is None
    env.info = dataclasses.replace(env.info, attempt=1, activity_id="old")
    assert "simulated" in (await env.run(AgentActivities(pool).call_agent, old)).output


async def test_the_agent_activity_gives_the_sim_the_verifiers_reading_of_the_reference() -> None:
    # The workflow sends the task as given (verifier unset, no key); the activity reads the
    # reference with the verifiers, so a right answer to a math expression is one math-verify
    # parses (boxed), which the sim could not know by itself.
    pool = Pool.model_validate({
        "conductor": {"id": "conductor", "provider": "local", "model": "m"},
        "agents": [{"id": "sure", "provider": "sim", "model": "sim",
                    "sim": {"default_skill": 1.0}},
                   {"id": "hopeless", "provider": "sim", "model": "sim",
                    "sim": {"default_skill": 0.0}}],
    })
    env = ActivityEnvironment()
    for reference in ("x^2+1", "(C)", "Paris"):
        task = TaskInfo(task_id=f"t-{reference}", reference=reference)
        assert task.key is None
        for agent, reward in (("sure", 1.0), ("hopeless", 0.5)):
            env.info = dataclasses.replace(env.info, activity_id=f"{agent}-{reference}")
            reply = await env.run(AgentActivities(pool).call_agent, AgentCallInput(
                agent=agent, question="q", subtask="s", task=task))
            assert score_run("completed", reply.output, reference, None).value == reward, (
                reference, agent, reply.output)
    assert sim_provider.answer(pool.get("sure"), SimSettings(default_skill=1.0),
                               TaskInfo(task_id="t", reference="x^2+1")) == "x^2+1", (
        "without the key a hand-made TaskInfo reads the reference as exact")


# --- the pool file ------------------------------------------------------------------------


def load(tmp_path: Path, text: str) -> Pool:
    path = tmp_path / "pool.toml"
    path.write_text(text)
    return Pool.load(path)


CONDUCTOR = '[conductor]\nid = "conductor"\nprovider = "local"\nmodel = "m"\n'


def test_a_sim_agent_needs_no_key_and_gets_default_settings(tmp_path: Path) -> None:
    pool = load(tmp_path, CONDUCTOR + '[[agents]]\nid = "a"\nprovider = "sim"\nmodel = "sim"\n')
    agent = pool.get("a")
    assert agent.sim == SimSettings() and agent.is_configured({})
    assert [a.id for a in pool.available({})] == ["a", "conductor"]


@pytest.mark.parametrize(("agent", "message"), [
    ('provider = "sim"\nsim = { skills = { math = 1.5 } }',
     "agents.0.sim.skills.math: Input should be less than or equal to 1"),
    ('provider = "sim"\nsim = { default_skill = -0.1 }',
     "agents.0.sim.default_skill: Input should be greater than or equal to 0"),
    ('provider = "sim"\nsim = { skills = { math = 0.5, Math = 0.9 } }', "names a tag twice"),
    ('provider = "sim"\nsim = { skill = { math = 0.5 } }', "agents.0.sim.skill: Extra inputs"),
    ('provider = "sim"\nsim = { latency_s = -1 }', "agents.0.sim.latency_s"),
    ('provider = "openai"\napi_key_env = "K"\nsim = { default_skill = 0.5 }',
     "`sim` settings are for provider \"sim\" only, not openai"),
])
def test_bad_sim_settings_are_refused_naming_the_place(
    tmp_path: Path, agent: str, message: str
) -> None:
    with pytest.raises(PoolError) as e:
        load(tmp_path, CONDUCTOR + f'[[agents]]\nid = "a"\nmodel = "sim"\n{agent}\n')
    assert message in str(e.value) and str(tmp_path) in str(e.value)


def test_a_sim_conductor_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PoolError, match="a sim agent only answers tasks and cannot write plans"):
        load(tmp_path, '[conductor]\nid = "conductor"\nprovider = "sim"\nmodel = "sim"\n'
                       '[[agents]]\nid = "a"\nprovider = "sim"\nmodel = "sim"\n')


def test_the_shipped_rehearsal_pool_has_one_competent_agent_per_task_tag() -> None:
    pool = Pool.load(EXAMPLES / "pool.toml")
    assert pool.conductor.provider == "local" and not pool.offer_conductor_as_agent
    assert len({a.description for a in pool.agents}) == 1, "descriptions must not give it away"
    loaded = load_tasks(str(EXAMPLES / "tasks.jsonl"))
    assert not loaded.errors and 16 <= len(loaded.tasks) <= 32
    tags = {t for task in loaded.tasks for t in task.tags}
    for tag in tags:
        skills = sorted(a.sim.skill([tag]) for a in pool.agents if a.sim is not None)
        assert skills[-1] >= 0.9 and skills[-2] <= 0.2, tag
        assert sum(t.tags == [tag] for t in loaded.tasks) == len(loaded.tasks) // len(tags)
    for task in loaded.tasks:
        assert task.options.max_steps == 1 and task.reference
        competent = next(a for a in pool.agents if a.sim and a.sim.skill(task.tags) > 0.9)
        ref = task.reference
        key = answer_key(ref, task.verifier)
        right = sim_provider.right_answer(ref, key)
        wrong = sim_provider.wrong_answer(ref, key)
        assert score_run("completed", right, ref, task.verifier).value == 1.0, competent.id
        assert score_run("completed", wrong, ref, task.verifier).value == 0.5


# --- end to end ---------------------------------------------------------------------------


def rehearsal_pool(server: Any) -> Pool:
    """The scripted conductor of the workflow tests, delegating to two sim agents."""
    base = make_pool(server)
    return Pool.model_validate({
        "conductor": base.conductor.model_dump(),
        "offer_conductor_as_agent": False,
        "agents": [
            {"id": "alpha", "provider": "sim", "model": "sim", "description": "an assistant",
             "price_output_per_mtok": 4.0,
             "sim": {"skills": {"math": 1.0}, "default_skill": 0.0, "latency_s": 0.05,
                     "output_tokens": 20}},
            {"id": "bravo", "provider": "sim", "model": "sim", "description": "an assistant",
             "sim": {"skills": {"math": 0.0}, "default_skill": 0.0}},
        ],
    })


async def test_a_run_with_sim_agents_scores_the_competent_agent_1_and_the_weak_one_half(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings,
    trace_store: TraceStore,
) -> None:
    agent_server.set_responder("conductor", lambda prompt: plan_json(
        ("bravo", "Guess first.", []), ("alpha", "Work out 7 x 8.", "all"))
        if "[two]" in prompt else plan_json(("bravo", "Work out 7 x 8.", [])))
    sampling = RolloutSampling(sample=3)
    two_steps = Task(question="What is 7 x 8? [two]", reference="56", verifier="math",
                     tags=["math"], sampling=sampling)
    weak_only = Task(question="What is 7 x 8?", reference="56", tags=["math"], sampling=sampling)
    async with running_worker(client, settings, rehearsal_pool(agent_server)):
        res = await conductor.run(two_steps)
        weak = await conductor.run(weak_only)

    assert "alpha" in agent_server.requests("conductor")[0].text  # offered to the conductor
    assert res.status == "completed" and [s.agent for s in res.steps] == ["bravo", "alpha"]
    assert [s.output for s in res.steps] == ["57", "56"], "any step answers; the last one counts"
    assert res.answer == "56" and res.reward is not None and res.reward.value == 1.0
    assert res.steps[1].usage.output_tokens == 20 and res.steps[1].model == "sim"
    assert res.steps[1].cost_usd == pytest.approx(20 * 4.0 / 1e6)
    assert res.steps[1].seconds >= 0.05

    trace = await trace_store.get(res.workflow_id)
    assert trace is not None and trace.reward is not None and trace.reward.value == 1.0
    assert trace.answer == "56" and trace.task.sampling.sample == 3
    assert [s.output for s in trace.steps] == ["57", "56"]

    assert weak.answer == "57" and weak.reward is not None and weak.reward.value == 0.5


async def test_a_split_across_two_specialists_answers_a_composite_task_only_when_chained(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings,
) -> None:
    """The workflow hands the second step what it may see (its access), the agent activity
    hands that to the sim agent, and the composite task is right only when the final step saw
    the other specialist's part (docs/how-to/rehearse-plans.md)."""
    agent_server.set_responder("conductor", lambda prompt: plan_json(
        ("geo", "Part 1.", []), ("chem", "Part 2.", [0] if "[chained]" in prompt else [])))
    base = make_pool(agent_server)
    pool = Pool.model_validate({
        "conductor": base.conductor.model_dump(), "offer_conductor_as_agent": False,
        "agents": [
            {"id": "geo", "provider": "sim", "model": "sim",
             "sim": {"skills": {"geo": 1.0}, "default_skill": 0.0}},
            {"id": "chem", "provider": "sim", "model": "sim",
             "sim": {"skills": {"chem": 1.0}, "review": {"geo": 1.0}, "default_skill": 0.0}},
        ],
    })

    def task(mark: str) -> Task:
        return Task(question=f"Capital of France; symbol of gold? {mark}", reference="Paris; Au",
                    verifier="exact", tags=["geo+chem"], parts=["geo", "chem"])

    async with running_worker(client, settings, pool):
        chained = await conductor.run(task("[chained]"))
        apart = await conductor.run(task("[apart]"))
    assert chained.answer == "Paris; Au" and chained.reward is not None
    assert chained.reward.value == 1.0
    assert apart.answer == f"{sim_provider.UNSURE}; Au" and apart.reward is not None
    assert apart.reward.value == 0.5
