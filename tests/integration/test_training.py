"""GRPO training end to end on the real Temporal dev server and PostgreSQL: a tiny conductor
learns the routing of a sim pool from its own rollouts, a real SmolLM2 LoRA update is published
and served, and a trainer killed mid-update loses nothing and consumes nothing twice."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Replayer, Worker

from conductor_engine.engine.contracts.limits import TRAINING_PLAN_DEADLINE_S
from conductor_engine.engine.contracts.names import UPDATE_ACTIVITY, training_workflow_id
from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.contracts.tasks import RolloutSampling, RunOptions, Task
from conductor_engine.engine.contracts.traces import PolicyRef
from conductor_engine.engine.contracts.training import (
    HeldOutConfig,
    LossConfig,
    PolicyConfig,
    Recipe,
    RolloutConfig,
    UpdateRequest,
    UpdateResult,
    group_agents,
    split_heldout,
)
from conductor_engine.engine.contracts.training_runs import TrainInput, TrainProgress
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.providers.sim_pool import SimPoolSpec, pool_toml
from conductor_engine.engine.providers.sim_pool import tasks as sim_pool_tasks
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.payloads import data_converter
from conductor_engine.engine.storage.policies import PolicyRegistry
from conductor_engine.engine.storage.trace_store import TraceStore
from conductor_engine.engine.tasks.files import load_tasks
from conductor_engine.runtime.client import ConductorClient
from conductor_engine.trainer.service import build_trainer_worker
from conductor_engine.workflows.train import TrainingWorkflow
from tests.agent_server import AgentServer, Reply
from tests.cli import CONDUCTOR
from tests.conftest import make_pool, running_worker
from tests.faults.ledger import ROWS, FaultRow
from tests.plans import plan_json
from tests.rollout_groups import read_groups

ROOT = Path(__file__).resolve().parents[2]
SIM_POOL = ROOT / "examples" / "sim" / "pool.toml"
SIM_TASKS = ROOT / "examples" / "sim" / "tasks.jsonl"


def sim_pool(conductor_model: str, *, max_tokens: int = 64) -> Pool:
    """The shipped rehearsal pool (one competent agent per tag among four), with no latency,
    conducted by `conductor_model` under a name of this test's own (the registry is shared)."""
    pool = Pool.load(SIM_POOL)
    agents = [a.model_copy(update={"sim": a.sim.model_copy(update={  # type: ignore[union-attr]
        "latency_s": 0.0, "latency_jitter_s": 0.0})}) for a in pool.agents]
    conductor = pool.conductor.model_copy(update={
        "id": f"cond-{uuid.uuid4().hex[:8]}", "model": conductor_model,
        "params": pool.conductor.params.model_copy(update={"max_tokens": max_tokens})})
    return pool.model_copy(update={"conductor": conductor, "agents": agents})


def sim_tasks(ids: Collection[str] | None = None) -> list[Task]:
    """The sim example's tasks with these ids (the first of each tag when None), each with the
    shortest subtask the grammar allows: fewer random tokens, less gradient noise."""
    tasks, seen = [], set()
    for t in load_tasks(str(SIM_TASKS)).tasks:
        if (t.id in ids) if ids is not None else (t.tags[0] not in seen):
            seen.add(t.tags[0])
            options = t.options.model_copy(update={"subtask_max_chars": 8})
            tasks.append(t.model_copy(update={"options": options}))
    return tasks


def generated_pool(conductor_model: str, tmp_path: Path, *, seed: int, tasks_per_tag: int
                   ) -> tuple[Pool, list[Task], SimPoolSpec]:
    """A pool `conductor sim pool` writes (four look-alike agents, one competent per tag, four
    tags), conducted by `conductor_model` under a name of this test's own, and its tasks with
    the shortest subtask the grammar allows (fewer random tokens, less gradient noise). Not
    picked for separability: whatever the seed's generator writes."""
    spec = SimPoolSpec(agents=4, tags=4, seed=seed, tasks_per_tag=tasks_per_tag)
    (tmp_path / "pool.toml").write_text(pool_toml(spec, conductor=conductor_model))
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sim_pool_tasks(
        spec)))
    pool = Pool.load(tmp_path / "pool.toml")
    conductor = pool.conductor.model_copy(update={
        "id": f"cond-{uuid.uuid4().hex[:8]}",
        "params": pool.conductor.params.model_copy(update={"max_tokens": 64})})
    tasks = [t.model_copy(update={"options": t.options.model_copy(update={"subtask_max_chars": 8})})
             for t in load_tasks(str(tmp_path / "tasks.jsonl")).tasks]
    return pool.model_copy(update={"conductor": conductor}), tasks, spec


def best_routing_reward(pool: Pool) -> float:
    """Mean reward of always picking each task's competent agent (0.5 + 0.5 * its skill)."""
    best = max(max(a.sim.skills.values()) for a in pool.agents)  # type: ignore[union-attr]
    return 0.5 + 0.5 * best


@asynccontextmanager
async def training_stack(client: Client, settings: Settings, pool: Pool
                         ) -> AsyncIterator[ConductorClient]:
    """A conduct worker (rollouts and the training workflow) and a trainer worker."""
    async with running_worker(client, settings, pool), build_trainer_worker(client, settings):
        yield ConductorClient(client, settings)


def trainer_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"trainer_task_queue": f"trainer-{uuid.uuid4().hex[:8]}"})


async def wait_for(handle: WorkflowHandle[Any, Any], check: Any, timeout: float) -> TrainProgress:
    deadline = asyncio.get_running_loop().time() + timeout
    shown = 0
    while True:
        p = await handle.query(TrainingWorkflow.progress)
        for s in p.history[shown:]:  # shown with -s, and in a failure's captured output
            print(f"it {s.iteration}: reward {s.mean_reward} loss {s.loss} |g| {s.grad_norm} "
                  f"clip {s.clip_fraction} {s.rollout_seconds:.1f}+{s.update_seconds:.1f}s "
                  f"{s.note or ''}", flush=True)
        shown = len(p.history)
        if check(p):
            return p
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out; progress: {p.model_dump_json(indent=1)}")
        await asyncio.sleep(0.5)


@pytest.mark.slow
async def test_a_tiny_conductor_learns_the_routing_of_a_generated_pool(
    client: Client, settings: Settings, tiny_policy_dir: Path, tmp_path: Path,
    trace_store: TraceStore,
) -> None:
    """From chance to 0.9 of perfect routing (0.8775) on two iterations running, on fresh
    rollouts of a one-layer conductor (tests/tiny_policy.py) over a generated pool: 20 tasks of
    four tags, 16 trained on (every task a group of 4 each iteration, 4 clipped steps on them)
    and 4 held out, which every 4th version answers greedily as training goes.

    Deterministic: every plan is sampled from its own seed (task, sample, version, round,
    attempt: activities/plan.py) and generated alone by the local conductor, and the trainer
    reads each group in sample order with torch seeded per update; so the curve is the same on
    every run, on an idle or a busy machine, and only a hung run meets the timeout. Not across
    library releases or CPUs: on the same code the group baseline crossed in CI at iterations
    8 and 9, and a later CI run (reproduced locally) never crossed in 30; so the recipe is one
    that crossed on three pool seeds and three initialisations (docs/results/learning.md)."""
    settings = trainer_settings(settings)
    pool, tasks, _ = generated_pool(str(tiny_policy_dir), tmp_path, seed=0, tasks_per_tag=5)
    train, held = split_heldout(tasks, 0.2)
    assert len(train) == 16 and len(held) == 4
    target = 0.9 * best_routing_reward(pool)
    recipe = Recipe(
        policy=PolicyConfig(base=str(tiny_policy_dir), lora=False),
        loss=LossConfig(learning_rate=4e-3, micro_batch_size=32, max_grad_norm=1.0,
                        steps_per_update=4, epsilon_high=0.28),
        # the batch baseline: a task whose 4 rollouts all went to one wrong agent is still
        # pushed off it (its mean is below the update's), where a group baseline gives such a
        # group nothing and the task stays on that agent (recipe K, docs/results/learning.md)
        rollouts=RolloutConfig(group_size=4, groups_per_update=16, max_staleness=0,
                               scale_rewards=False, baseline="batch"),
        heldout=HeldOutConfig(fraction=0.2, every=4),
    )
    inp = TrainInput(name=f"learn-{uuid.uuid4().hex[:6]}", policy=pool.conductor.id,
                     tasks=train, heldout_tasks=held, iterations=30, recipe=recipe,
                     trainer_task_queue=settings.trainer_task_queue)
    async with training_stack(client, settings, pool) as conductor:
        await conductor.start_training(inp)
        handle = client.get_workflow_handle(training_workflow_id(inp.name),
                                            result_type=TrainProgress)

        def learned(p: TrainProgress) -> bool:
            last = [s.mean_reward or 0.0 for s in p.history[-2:]]
            return len(last) == 2 and min(last) >= target or p.iteration >= inp.iterations

        # a safety net only, for a hung run: the seeds fix the curve, whatever the load
        p = await wait_for(handle, learned, timeout=40 * 60)
        await handle.signal(TrainingWorkflow.stop)
        final: TrainProgress = await handle.result()
    # judged on the progress that ended the wait: an iteration under way when stop came may
    # still finish and be recorded
    curve = [round(s.mean_reward or 0.0, 3) for s in p.history]
    print("reward curve:", curve)
    assert curve[0] < 0.8, f"an untrained conductor routes by chance: {curve}"
    assert min(curve[-2:]) >= target, f"no learning in {p.iteration} iterations: {curve}"
    assert final.phase == "stopped" and final.version == len(final.history)
    # one plan attempt per rollout (no retries): the grammar keeps nearly every plan valid; a
    # plan cut off at its token limit still counts invalid, as in the paper
    rates = [s.valid_plan_rate for s in final.history if s.valid_plan_rate is not None]
    print("valid plan rates:", rates)
    assert rates and sum(rates) / len(rates) >= 0.9, rates

    # held out as it went: the start, every 4th version, and the last; greedy, never trained on
    evaluated = [e.version for e in final.evals]
    print("held out:", [(e.version, e.accuracy, e.mean_reward) for e in final.evals])
    n = final.iteration
    assert evaluated == ["base", *[f"v{k}" for k in [*range(4, n, 4), n]]], evaluated
    for e in final.evals:
        assert e.runs == len(held) and e.accuracy is not None and e.mean_reward is not None
        traces = await trace_store.batch_traces(e.batch, resolve_blobs=False)
        assert sorted(t.task.id for t in traces) == sorted(f"heldout~{t.id}" for t in held)
        assert all(t.policy.version == e.version and t.task.options.temperature == 0.0
                   and t.task.options.plan_deadline_s == TRAINING_PLAN_DEADLINE_S
                   for t in traces)
    untouched = await read_groups(
        trace_store, PolicyRef(name=pool.conductor.id, version="base"), size=1, limit=100,
        unconsumed=True, task_ids=[f"heldout~{t.id}" for t in held])
    assert len(untouched) == len(held), "no update ever consumed a held-out run"


def coin_pool(conductor_model: str) -> Pool:
    """The sim pool with every agent right half the time: whatever the routing, a group's
    rewards differ (the sim draw is seeded per sample), so an update always has a signal."""
    pool = sim_pool(conductor_model)
    agents = [a.model_copy(update={"sim": a.sim.model_copy(update={  # type: ignore[union-attr]
        "skills": {}, "default_skill": 0.5})}) for a in pool.agents]
    return pool.model_copy(update={"agents": agents})


@pytest.mark.slow
async def test_a_lora_update_of_the_real_local_model_is_published_and_serves_the_next_run(
    client: Client, settings: Settings, smollm2_model_dir: Path, trace_store: TraceStore,
) -> None:
    settings = trainer_settings(settings)
    pool = coin_pool(str(smollm2_model_dir))
    name = pool.conductor.id
    tasks = sim_tasks()[:3]
    async with training_stack(client, settings, pool) as conductor:
        # rollouts first, as ordinary runs: three groups of four under the base model
        runs = [revised(t, sampling=RolloutSampling(sample=i)) for t in tasks for i in range(4)]
        ids = [await conductor.submit(t, workflow_id=f"{name}/{t.id}/{t.sampling.sample}")
               for t in runs]
        results = await asyncio.gather(*(conductor.result(i) for i in ids))
        assert all(r.rounds[0].attempts[0].policy_version == "base" for r in results)
        # the stored trace says which plan tokens the grammar forced, and the trainer's sample
        # leaves exactly those out of the loss
        from transformers import AutoTokenizer

        from conductor_engine.trainer.rollouts import attempt_sample, deciding_attempts

        stored = await trace_store.get(ids[0])
        assert stored is not None
        attempt = deciding_attempts(stored)[-1]
        assert attempt.forced_positions and attempt.token_ids
        sample = attempt_sample(attempt, AutoTokenizer.from_pretrained(smollm2_model_dir), 1.0)
        assert sample is not None and sample.forced is not None
        assert [k for k, f in enumerate(sample.forced) if f] == attempt.forced_positions
        assert 0 < sample.trained_tokens < len(attempt.token_ids)

        recipe = Recipe(policy=PolicyConfig(base=str(smollm2_model_dir), lora=True, lora_r=8),
                        loss=LossConfig(learning_rate=1e-4, micro_batch_size=4),
                        rollouts=RolloutConfig(group_size=4, groups_per_update=3,
                                               max_staleness=100))
        inp = TrainInput(name=f"lora-{uuid.uuid4().hex[:6]}", policy=name, from_traces=True,
                         iterations=1, recipe=recipe,
                         trainer_task_queue=settings.trainer_task_queue)
        await conductor.start_training(inp)
        final = await client.get_workflow_handle(
            training_workflow_id(inp.name), result_type=TrainProgress).result()
        assert final.version == 1 and final.history[0].published == "v1", final
        step = final.history[0]
        assert step.rollouts == 12 and step.trained_tokens > 0 and step.grad_norm

        version = await PolicyRegistry(trace_store.pool).get(name, 1)
        assert version.kind == "lora" and version.parent == 0
        assert {"adapter_model.safetensors", "adapter_config.json"} <= set(version.files)

        nxt = await conductor.run(tasks[0].model_copy(update={"id": "after-update"}))
    assert nxt.rounds[0].attempts[0].policy_version == "v1"
    trace = await trace_store.get(nxt.workflow_id)
    assert trace is not None and trace.policy.version == "v1"
    from conductor_engine.engine.providers.local.model import loaded_models

    assert any(k.startswith(f"{smollm2_model_dir}@") for k in loaded_models), "adapter applied"


def scripted_rollouts(server: AgentServer) -> None:
    """A conductor and agents on the agent server whose runs differ per sample, by a counter
    per task: alpha's first plan is malformed and its answers alternate right and wrong; beta's
    first plan sends its step to an agent that answers 500 until the retries run out; gamma's
    reference is no letter, so its choice verifier fails on every answer."""
    plans = {"ALPHA": itertools.count(), "BETA": itertools.count()}

    def conductor(prompt: str) -> str:
        if "TASK-ALPHA" in prompt:
            return "no plan here" if next(plans["ALPHA"]) == 0 else plan_json(
                ("gpt", "Answer the alpha question.", []))
        if "TASK-BETA" in prompt:
            marker = " FAILME" if next(plans["BETA"]) == 0 else ""
            return plan_json(("claude", f"Answer the beta question.{marker}", []))
        return plan_json(("gemini", "Answer the gamma question.", []))

    alpha, beta = itertools.count(), itertools.count()
    server.set_responder("conductor", conductor)
    server.set_responder("gpt", lambda _: "42" if next(alpha) % 2 else "41")
    server.set_responder("claude", lambda text: Reply.error(500, "overloaded")
                         if "FAILME" in text else "7" if next(beta) % 2 else "8")
    server.set_responder("gemini", lambda _: "A")


async def test_runs_that_failed_for_infrastructure_reasons_are_left_out_of_their_groups(
    client: Client, settings: Settings, agent_server: AgentServer, tiny_policy_dir: Path,
    trace_store: TraceStore,
) -> None:
    """One iteration of three groups of 4. alpha: every run a rollout, its malformed plan one
    attempt scored 0. beta: a run whose agent kept answering 500 is left out, the other three
    form the group. gamma: the verifier failed on all four, so no group forms. Nothing of it
    is scored 0 in a group, and each left-out run is counted by reason."""
    settings = trainer_settings(settings)
    scripted_rollouts(agent_server)
    pool = make_pool(agent_server, conductor={"id": f"cond-{uuid.uuid4().hex[:8]}"})
    options = RunOptions(max_step_attempts=2, max_plan_attempts=3)  # training overrides plans
    tasks = [Task(id=f"{k}-{uuid.uuid4().hex[:6]}", question=f"TASK-{k.upper()}: {q}",
                  reference=ref, verifier=v, options=options)
             for k, q, ref, v in (("alpha", "What is 6 * 7?", "42", "exact"),
                                  ("beta", "What is 3 + 4?", "7", "exact"),
                                  ("gamma", "Which letter?", "42", "choice"))]
    recipe = Recipe(policy=PolicyConfig(base=str(tiny_policy_dir), lora=False),
                    loss=LossConfig(learning_rate=1e-3, micro_batch_size=8),
                    rollouts=RolloutConfig(group_size=4, groups_per_update=3, max_staleness=0,
                                           scale_rewards=False))
    inp = TrainInput(name=f"honest-{uuid.uuid4().hex[:6]}", policy=pool.conductor.id,
                     tasks=tasks, iterations=1, recipe=recipe,
                     trainer_task_queue=settings.trainer_task_queue)
    async with training_stack(client, settings, pool) as conductor:
        await conductor.start_training(inp)
        final = await asyncio.wait_for(client.get_workflow_handle(
            training_workflow_id(inp.name), result_type=TrainProgress).result(), timeout=300)

    [it] = final.history
    assert it.published == "v1", it
    assert it.left_out == {"verifier_error": 4, "step_failed": 1}
    assert it.update_left_out == it.left_out, "the trainer left out the same runs"
    assert it.rollouts == 7 and it.valid_plan_rate == pytest.approx(6 / 7)

    policy = PolicyRef(name=pool.conductor.id, version="base")
    groups = {g.task_id.split("-")[0]: g for g in await read_groups(trace_store, policy, size=4)}
    alpha, beta, gamma = groups["alpha"], groups["beta"], groups["gamma"]
    # a rollout gets one plan attempt: a malformed plan is a 0 with no retry feedback
    every = [t for g in groups.values() for t in g.traces] + [
        await trace_store.get(x.workflow_id) for g in groups.values() for x in g.left_out]
    assert len(every) == 12
    assert all(t is not None and len(r.attempts) == 1 for t in every for r in t.rounds)
    [invalid] = [t for t in alpha.traces if t.status == "invalid_plan"]
    assert invalid.reward is not None and invalid.reward.value == 0.0
    assert "not a valid plan" not in invalid.rounds[0].attempts[0].prompt[-1].content
    assert len(alpha.traces) == 4 and not alpha.left_out
    # beta: the 500s left their run out; the group and its advantages are the other three
    [failed] = beta.left_out
    assert failed.reason == "step_failed" and "overloaded" in (failed.detail or "")
    assert len(beta.traces) == 3 and all(t.status == "completed" for t in beta.traces)
    assert not gamma.traces and {x.reason for x in gamma.left_out} == {"verifier_error"}
    rewards = alpha.rewards + beta.rewards
    assert it.mean_reward == pytest.approx(sum(rewards) / len(rewards))
    version = await PolicyRegistry(trace_store.pool).get(pool.conductor.id, 1)
    assert version.metrics["samples"] == 7, "one sample per rollout: none of a left-out run"
    assert version.metrics["left_out"] == it.left_out
    consumed = await PolicyRegistry(trace_store.pool).consumed_by(version.update_id)
    assert len(consumed) == 12, "every run was decided on, so none is chosen again"


def trainer_process(settings: Settings, log: Path) -> subprocess.Popen[bytes]:
    """`conductor trainer` in a process of its own, so the test can kill it."""
    env = {**os.environ, "CONDUCTOR_TEMPORAL_ADDRESS": settings.temporal_address or "",
           "CONDUCTOR_DATABASE_URL": settings.database_url or "",
           "CONDUCTOR_DATA_DIR": str(settings.data_dir),
           "CONDUCTOR_TRAINER_TASK_QUEUE": settings.trainer_task_queue,
           "CONDUCTOR_LOG_LEVEL": "info"}
    return subprocess.Popen(
        [*CONDUCTOR, "trainer"],
        env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)


async def test_a_trainer_killed_mid_update_is_retried_and_consumes_each_group_once(
    client: Client, settings: Settings, tiny_policy_dir: Path, trace_store: TraceStore,
    tmp_path: Path,
) -> None:
    settings = trainer_settings(settings)
    pool = coin_pool(str(tiny_policy_dir))
    tasks = sim_tasks()[:2]
    recipe = Recipe(policy=PolicyConfig(base=str(tiny_policy_dir), lora=False),
                    loss=LossConfig(learning_rate=1e-3, micro_batch_size=8),
                    rollouts=RolloutConfig(group_size=4, groups_per_update=2, max_staleness=0))
    inp = TrainInput(name=f"kill-{uuid.uuid4().hex[:6]}", policy=pool.conductor.id,
                     tasks=tasks, iterations=2, recipe=recipe, update_heartbeat_s=3,
                     trainer_task_queue=settings.trainer_task_queue)
    log = tmp_path / "conductor_engine.trainer.log"
    first = trainer_process(settings, log)
    second = None
    try:
        async with running_worker(client, settings, pool):
            await ConductorClient(client, settings).start_training(inp)
            handle = client.get_workflow_handle(training_workflow_id(inp.name),
                                                result_type=TrainProgress)
            for _ in range(600):  # until the first update is running on the trainer
                desc = await handle.describe()
                if any(a.activity_type.name == "grpo_update" and a.state == 2  # STARTED
                       for a in desc.raw_description.pending_activities):
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"the update never started; trainer log:\n{log.read_text()}")
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
            second = trainer_process(settings, log)
            final = await asyncio.wait_for(handle.result(), timeout=300)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait()

    assert final.version == 2 and [s.published for s in final.history] == ["v1", "v2"]
    status, shown = await ConductorClient(client, settings).training_progress(inp.name)
    assert status == "completed" and shown == final, "what `conductor train status` shows"
    registry = PolicyRegistry(trace_store.pool)
    versions = await registry.history(pool.conductor.id)
    assert [v.version for v in versions] == [1, 2]
    rows = await trace_store.pool.fetch(
        "SELECT consumed_by, count(*) AS n FROM traces WHERE policy_name = $1 AND depth = 0 "
        "GROUP BY consumed_by ORDER BY consumed_by", pool.conductor.id)
    assert [(r["consumed_by"], r["n"]) for r in rows] == [(v.update_id, 8) for v in versions], \
        "each update consumed its own 2 groups of 4, and every rollout was consumed once"
    started = [e for e in await _history_events(client, inp.name)
               if e.HasField("activity_task_started_event_attributes")]
    assert any(e.activity_task_started_event_attributes.attempt >= 2 for e in started), \
        "the killed update ran again"
    # the fault suite's row (tests/faults/ledger.py): rollouts instead of batch runs; an update
    # that consumed a rollout twice would count as paid twice, one never consumed as lost
    consumed = sum(r["n"] for r in rows if r["consumed_by"] is not None)
    ROWS.append(FaultRow(
        kind="trainer SIGKILLed mid-update", submitted=16, completed=consumed,
        lost=16 - consumed, traces_missing=16 - sum(r["n"] for r in rows),
        note="16 rollouts in 2 updates; the killed update ran again on a new trainer and "
             "published once (v1, v2); every rollout consumed by exactly one update"))


async def _history_events(client: Client, name: str) -> list[Any]:
    """Events of every run of the training workflow (it continues as new per iteration)."""
    events: list[Any] = []
    async for wf in client.list_workflows(f"WorkflowId = '{training_workflow_id(name)}'"):
        handle = client.get_workflow_handle(wf.id, run_id=wf.run_id)
        events.extend([e async for e in handle.fetch_history_events()])
    return events


@activity.defn(name=UPDATE_ACTIVITY)
async def _no_update(req: UpdateRequest) -> UpdateResult:
    """The update, stood in for: these tests are about the rollouts."""
    return UpdateResult(name=req.name, version=req.parent, published=False, reason="stand-in")


def _first_listed_agent(prompt: str) -> str:
    """A conductor that plans with the agent its pool listing shows first."""
    listed = [a for a in ("gpt", "claude", "gemini") if a in prompt]
    return plan_json((min(listed, key=prompt.index), "Answer it.", []))


@pytest.mark.parametrize("per", ["group", "rollout"])
async def test_each_rollout_plans_with_the_random_subset_of_the_pool_drawn_for_it(
    client: Client, settings: Settings, agent_server: AgentServer, trace_store: TraceStore,
    per: Literal["group", "rollout"],
) -> None:
    """One iteration of three groups of 4 with pool_subset 1..2 and shuffle_pool: each run is
    offered the agents drawn for it (from seed, name, iteration, task and, per rollout, its
    sample), in the drawn order, one draw shared by a group's runs or one each; its trace
    records them with the task and in the prompt; and the workflow's history replays."""
    agent_server.set_responder("conductor", _first_listed_agent)
    for agent in ("gpt", "claude", "gemini"):
        agent_server.set_responder(agent, lambda _: "42")
    pool = make_pool(agent_server, conductor={"id": f"cond-{uuid.uuid4().hex[:8]}"})
    tasks = [Task(id=f"sub{i}-{uuid.uuid4().hex[:6]}", question=f"What is {i} + 42 - {i}?",
                  reference="42", verifier="exact") for i in range(3)]
    cfg = RolloutConfig(group_size=4, groups_per_update=3, pool_subset_min=1, pool_subset_max=2,
                        shuffle_pool=True, vary_pool_per=per)
    inp = TrainInput(name=f"subsets-{uuid.uuid4().hex[:6]}", policy=pool.conductor.id,
                     tasks=tasks, iterations=1,
                     recipe=Recipe(rollouts=cfg, loss=LossConfig(temperature=0.7), seed=7),
                     agents=["gpt", "claude", "gemini"],
                     trainer_task_queue=f"{settings.task_queue}-trainer")
    async with running_worker(client, settings, pool), Worker(
            client, task_queue=inp.trainer_task_queue, activities=[_no_update]):
        await ConductorClient(client, settings).start_training(inp)
        handle = client.get_workflow_handle(training_workflow_id(inp.name),
                                            result_type=TrainProgress)
        final = await asyncio.wait_for(handle.result(), timeout=120)
        history = await handle.fetch_history()
    assert final.history[0].rollouts == 12

    policy = PolicyRef(name=pool.conductor.id, version="base")
    groups = await read_groups(trace_store, policy, size=4, task_ids=[t.id for t in tasks])
    assert len(groups) == 3
    for g in groups:
        for t in g.traces:
            drawn = group_agents(inp.agents, cfg, seed=7, name=inp.name, iteration=0,
                                 task_id=g.task_id, sample=t.task.sampling.sample)
            assert drawn is not None and 1 <= len(drawn) <= 2
            assert t.task.agents == drawn
            system = t.rounds[0].attempts[0].prompt[0].content
            assert all((a in system) == (a in drawn) for a in ("gpt", "claude", "gemini"))
            assert [s.agent for s in t.steps] == drawn[:1], "the first agent shown"
        assert {t.task.options.temperature for t in g.traces} == {0.7}, "the recipe's"
        assert {t.task.options.plan_deadline_s for t in g.traces} == {TRAINING_PLAN_DEADLINE_S}
        seen = {tuple(t.task.agents or []) for t in g.traces}
        if per == "group":
            assert len(seen) == 1, "one subset per group"
    if per == "rollout":  # four runs of each of three groups all drawing alike: p < 1e-7
        assert any(len({tuple(t.task.agents or []) for t in g.traces}) > 1 for g in groups), \
            "runs of a group draw apart"
    await Replayer(workflows=[TrainingWorkflow], data_converter=data_converter(settings)
                   ).replay_workflow(history)


async def test_a_recipe_that_varies_the_pool_needs_agents_to_draw_from(
    client: Client, settings: Settings,
) -> None:
    inp = TrainInput(name="no-agents", policy="p", tasks=[Task(question="q")],
                     recipe=Recipe(rollouts=RolloutConfig(shuffle_pool=True)))
    with pytest.raises(ValueError, match="no agents to draw from"):
        await ConductorClient(client, settings).start_training(inp)


async def test_rollouts_at_another_temperature_than_the_recipe_scores_are_refused(
    client: Client, settings: Settings,
) -> None:
    inp = TrainInput(name="hot", policy="p", tasks=[Task(question="q")], temperature=1.3)
    with pytest.raises(ValueError, match=r"recipe's \[loss\] temperature 1.0"):
        await ConductorClient(client, settings).start_training(inp)
