"""The warm-up end to end on the real Temporal dev server and PostgreSQL: scored runs of the
training tasks, then a training run whose recipe asks for `[warmup]` publishes a warm-up version
from them on the trainer's queue, continues GRPO from it, and does not redo it when resumed."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

from conductor_engine.engine.contracts.names import training_workflow_id, warmup_id
from conductor_engine.engine.contracts.records import RunResult
from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.contracts.tasks import Task, rollout_sampling
from conductor_engine.engine.contracts.traces import StoredRun, Trace
from conductor_engine.engine.contracts.training import (
    HeldOutConfig,
    LossConfig,
    PolicyConfig,
    Recipe,
    RolloutConfig,
    WarmupConfig,
)
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.policies import PolicyRegistry
from conductor_engine.engine.storage.trace_store import TraceStore
from conductor_engine.workflows.train import TrainInput, TrainProgress
from tests.integration.test_training import sim_pool, sim_tasks, trainer_settings, training_stack

SAMPLES = 6


@pytest.mark.slow  # about 40 s: 24 scored runs, a warm-up, two GRPO iterations, three evaluations
async def test_a_training_run_warms_up_on_the_best_scored_runs_then_continues_grpo_from_it(
    client: Client, settings: Settings, tiny_policy_dir: Path, trace_store: TraceStore,
) -> None:
    """Six scored runs of each of four sim tasks by the tiny conductor itself (its exploring
    rollouts, temperature 1); three tasks are trained on and one held out. The warm-up learns
    the best right run of each training task that has one (never the held-out task's, though
    its runs scored as well), publishes v1 as a warm-up version from base, and iteration 0 of
    GRPO samples with v1 and publishes v2, its KL term measured against v1 (pinned for it).
    Resumed for a second iteration, the run does not warm up again. The warm-up reads only
    this test's conductor's runs (`conductors`): the store is shared, and other tests run the
    same sim tasks under conductors of their own."""
    settings = trainer_settings(settings)
    pool = sim_pool(str(tiny_policy_dir))
    policy = pool.conductor.id
    tasks = sim_tasks()
    train, held = tasks[:3], tasks[3:]
    recipe = Recipe(
        policy=PolicyConfig(base=str(tiny_policy_dir), lora=True, lora_r=8),
        loss=LossConfig(learning_rate=1e-3, micro_batch_size=8, beta=0.1),
        rollouts=RolloutConfig(group_size=2, groups_per_update=3, max_staleness=0),
        heldout=HeldOutConfig(every=1),
        warmup=WarmupConfig(enabled=True, epochs=2, learning_rate=3e-3, conductors=[policy]),
    )
    name = f"warm-{uuid.uuid4().hex[:6]}"
    inp = TrainInput(name=name, policy=policy, tasks=train, heldout_tasks=held, iterations=1,
                     recipe=recipe, trainer_task_queue=settings.trainer_task_queue)
    started = time.monotonic()
    async with training_stack(client, settings, pool) as conductor:
        def sampled(task: Task, sample: int) -> Task:
            return revised(task, options=revised(task.options, temperature=1.0,
                                                 max_plan_attempts=1),
                           sampling=rollout_sampling(sample))

        async def scored_run(task: Task, sample: int) -> RunResult:
            wid = await conductor.submit(sampled(task, sample),
                                         workflow_id=f"{name}-{task.id}-{sample}")
            return await conductor.result(wid)

        runs = await asyncio.gather(*(scored_run(t, k) for t in tasks for k in range(SAMPLES)))
        right = {r.task_id for r in runs if r.reward and r.reward.verdict
                 and r.reward.verdict.correct}
        assert held[0].id in right, "the held-out task has a right run the warm-up must skip"
        trained_right = right & {t.id for t in train}
        assert trained_right, "no right run of a training task to learn from"

        await conductor.start_training(inp)
        handle = client.get_workflow_handle(training_workflow_id(name), result_type=TrainProgress)
        final: TrainProgress = await asyncio.wait_for(handle.result(), timeout=600)
        print(f"scored runs and one warmed-up iteration: {time.monotonic() - started:.1f}s")

        w = final.warmup
        assert w is not None and w.published, w
        print("warm-up:", w.model_dump_json())
        assert (w.version, w.tasks, w.plans) == (1, 3, len(trained_right))
        assert w.tasks_with_plans == len(trained_right) and w.conductors == {policy: w.plans}
        assert w.mean_reward == 1.0 and w.step is not None and w.step.steps == 2
        assert w.logprob_after is not None and w.logprob_before is not None
        assert w.logprob_after > w.logprob_before
        # GRPO continued from the warm-up version; the held-out tasks answered each version
        assert [s.version for s in final.history] == ["v1"]
        assert final.history[0].published == "v2" and final.version == 2
        assert [e.version for e in final.evals] == ["base", "v1", "v2"]
        registry = PolicyRegistry(trace_store.pool)
        v1, v2 = await registry.get(policy, 1), await registry.get(policy, 2)
        assert v1.parent == 0 and v1.metrics["phase"] == "warmup"
        assert v1.update_id == warmup_id(training_workflow_id(name))
        assert v1.metrics["warmup"]["plans"] == w.plans
        assert v2.parent == 1 and "phase" not in v2.metrics
        assert await registry.consumed_by(v1.update_id) == [], "the warm-up consumes no trace"
        # the KL term (beta) measures against v1, where GRPO started, not against the base the
        # warm-up moved away from: 0 on the update that trains v1; v1 is pinned for it
        first = final.history[0]
        assert first.trained_tokens > 0 and first.kl == pytest.approx(0.0, abs=1e-6), first
        assert v1.pinned and not v2.pinned

        # resumed for one more iteration: GRPO goes on from v2; no second warm-up
        more = revised(inp, iterations=2, progress=revised(final, phase="starting"))
        assert (await conductor.start_training(more))[1]
        again: TrainProgress = await asyncio.wait_for(handle.result(), timeout=600)
    assert again.warmup == w and again.version == 3
    assert [s.version for s in again.history] == ["v1", "v2"]
    history = await registry.history(policy)
    assert [v.metrics.get("phase") for v in history] == ["warmup", None, None]


def conductor_wrote(task: Task, agent: str, policy: str, *, reward: float = 1.0,
                    cost: float = 0.01, minute: int = 0) -> Trace:
    """A scored run of `task` whose conductor (`policy`) wrote the one-step plan to `agent`,
    right when `reward` is 1; its plan text re-tokenized, as an API conductor's."""
    from conductor_engine.engine.contracts.agent_calls import Message
    from conductor_engine.engine.contracts.plans import Plan, Step
    from conductor_engine.engine.contracts.traces import PolicyRef
    from tests.plans import plan_json
    from tests.unit.trainer.test_warmup import scored

    trace = scored(task.id, reward, cost=cost, conductor=policy, minute=minute)
    trace.task = task
    trace.policy = PolicyRef(name=policy, version="base")
    trace.rounds[0].plan = Plan(steps=[Step(agent=agent, subtask="Solve.", access=[])])
    attempt = trace.rounds[0].attempts[0]
    attempt.prompt = [Message(role="user", content=f"Plan: {task.question}")]
    attempt.raw_text = plan_json((agent, "Solve.", []))
    attempt.token_ids = attempt.logprobs = None  # re-tokenized, as an API conductor's
    attempt.conductor_id, attempt.finish_reason = policy, "stop"
    return trace


async def warm_up_and_train_once(client: Client, settings: Settings, pool: Pool,
                                 tiny_policy_dir: Path, tasks: list[Task], warm: WarmupConfig,
                                 *, prefix: str) -> tuple[str, TrainProgress]:
    """A training run of `tasks` with this warm-up and one GRPO iteration of the tiny policy
    (full weights), on its own worker stack: the run's name and its final progress."""
    recipe = Recipe(
        policy=PolicyConfig(base=str(tiny_policy_dir), lora=False),
        loss=LossConfig(learning_rate=1e-3, micro_batch_size=8),
        rollouts=RolloutConfig(group_size=2, groups_per_update=2, max_staleness=0),
        warmup=warm)
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    inp = TrainInput(name=name, policy=pool.conductor.id, tasks=tasks, iterations=1,
                     recipe=recipe, trainer_task_queue=settings.trainer_task_queue)
    async with training_stack(client, settings, pool) as conductor:
        await conductor.start_training(inp)
        handle = client.get_workflow_handle(training_workflow_id(name), result_type=TrainProgress)
        return name, await asyncio.wait_for(handle.result(), timeout=600)


@pytest.mark.slow  # about 30 s: 16 rehearsal runs, a warm-up, one GRPO iteration
async def test_a_rehearsal_runs_each_tasks_candidate_plans_again_and_their_means_pick_the_plan(
    client: Client, settings: Settings, tiny_policy_dir: Path, trace_store: TraceStore,
) -> None:
    """Two training tasks (math, code), each with two one-step plans its conductor wrote and
    that were right once: a cheap one with the agent that is weak at the task (skill 0.1, the
    lucky run) and a dearer one with the competent agent (0.95). Ranked on those runs alone
    the cheap one is learned. The training run rehearses both plans of each task four more
    times as fixed plans on the pool's queue; their runs are scored and stored in the run's
    rehearsal batch, counted towards their plans' means, and the competent agent's plan is
    the one learned."""
    from conductor_engine.engine.contracts.names import BASELINE_POLICY, rehearsal_batch
    from conductor_engine.trainer.warmup import plan_signature, rank_plans

    settings = trainer_settings(settings)
    pool = sim_pool(str(tiny_policy_dir))
    policy = pool.conductor.id
    train = sim_tasks({"sim-math-1", "sim-code-1"})
    weak, competent = {"sim-math-1": "bravo", "sim-code-1": "alpha"}, {
        "sim-math-1": "alpha", "sim-code-1": "bravo"}

    for task in train:
        await trace_store.write(conductor_wrote(task, weak[task.id], policy, cost=0.0001))
        await trace_store.write(conductor_wrote(task, competent[task.id], policy, cost=0.01))
    ids = [t.id for t in train]
    warm = WarmupConfig(enabled=True, epochs=1, learning_rate=1e-3, conductors=[policy],
                        rehearse=4, rehearse_plans=2)

    async def chosen_agents(batch: str | None) -> dict[str, str]:
        runs = await trace_store.scored_runs(ids, per_task=256, policies=[policy], batch=batch)
        ranked, _ = rank_plans([r.trace for r in runs if r.trace], ids, warm, batch)
        return {t: plans[0].signature[0][0][0] for t, plans in ranked.items()}

    assert await chosen_agents(None) == weak, "the lucky cheap plans rank first unrehearsed"
    name, final = await warm_up_and_train_once(client, settings, pool, tiny_policy_dir, train,
                                               warm, prefix="rehearse")

    w = final.warmup
    assert w is not None and w.published and w.rehearsal is not None, w
    print("warm-up:", w.model_dump_json())
    r = w.rehearsal
    assert (r.tasks, r.plans, r.runs, r.left_out) == (2, 4, 16, {}) and r.seconds > 0
    rehearsed = await trace_store.batch_traces(rehearsal_batch(name))
    assert len(rehearsed) == 16
    assert {t.policy.name for t in rehearsed} == {BASELINE_POLICY}
    assert {t.task.id for t in rehearsed} == set(ids)
    assert {t.task.sampling.sample for t in rehearsed} == set(range(1_000_000, 1_000_004))
    by_plan: dict[tuple[str, str], list[float]] = {}
    for t in rehearsed:
        assert t.reward is not None and t.reward.value is not None
        by_plan.setdefault((t.task.id, plan_signature(t)[0][0][0]), []).append(t.reward.value)
    print("rehearsed rewards by plan:", by_plan)
    for task_id in ids:  # sim draws are fixed by task, agent and sample: these hold
        assert sum(by_plan[task_id, competent[task_id]]) > sum(by_plan[task_id, weak[task_id]])
    # the warm-up counted the rehearsals and trained on the competent agents' plans
    assert await chosen_agents(rehearsal_batch(name)) == competent
    assert (w.rank, w.plans, w.tasks_with_plans, w.counted_runs) == ("plan_mean", 2, 2, 20)
    means = [(1.0 + sum(by_plan[t, competent[t]])) / 5 for t in ids]
    assert w.mean_plan_reward == pytest.approx(sum(means) / 2)
    assert w.shapes == {"1 step": 2} and w.conductors == {policy: 2}
    assert [s.version for s in final.history] == ["v1"] and final.version == 2


@pytest.mark.slow  # about 30 s: 8 rehearsal runs, a warm-up, one GRPO iteration
async def test_a_task_that_never_wrote_its_kinds_plan_rehearses_a_siblings_and_learns_it(
    client: Client, settings: Settings, tiny_policy_dir: Path, trace_store: TraceStore,
) -> None:
    """Two math tasks (one kind: `plan_means_by = "tag"`). On sim-math-2 the conductor wrote
    the competent agent's plan three times, right each time; on sim-math-1 it only ever wrote
    the weak agent's, right once and wrong once. The kind ranks the competent plan first, so
    the rehearsal runs sim-math-2's text of it on sim-math-1 too (4 runs each task), and the
    warm-up trains sim-math-1 on it, under sim-math-1's own prompt and credited with its own
    runs of it."""
    from conductor_engine.engine.contracts.names import rehearsal_batch
    from conductor_engine.trainer.warmup import select_plans

    settings = trainer_settings(settings)
    pool = sim_pool(str(tiny_policy_dir))
    policy = pool.conductor.id
    never, wrote = sim_tasks({"sim-math-1"})[0], sim_tasks({"sim-math-2"})[0]
    ids = [never.id, wrote.id]
    for trace in [conductor_wrote(never, "bravo", policy, cost=0.0001),
                  conductor_wrote(never, "bravo", policy, reward=0.25, minute=1),
                  *(conductor_wrote(wrote, "alpha", policy, minute=i) for i in range(3))]:
        await trace_store.write(trace)
    warm = WarmupConfig(enabled=True, epochs=1, learning_rate=1e-3, conductors=[policy],
                        rehearse=4, rehearse_plans=1, plan_means_by="tag")
    name, final = await warm_up_and_train_once(client, settings, pool, tiny_policy_dir,
                                               [never, wrote], warm, prefix="borrow")

    w = final.warmup
    assert w is not None and w.published and w.rehearsal is not None, w
    assert (w.rehearsal.tasks, w.rehearsal.plans, w.rehearsal.runs) == (2, 2, 8)
    rehearsed = await trace_store.batch_traces(rehearsal_batch(name))
    assert {(t.task.id, t.rounds[0].plan.steps[0].agent) for t in rehearsed  # type: ignore[union-attr]
            } == {(never.id, "alpha"), (wrote.id, "alpha")}
    # what the warm-up trained on: the competent plan on both tasks, each under its own prompt
    runs = await trace_store.scored_runs(ids, per_task=256, policies=[policy],
                                         batch=rehearsal_batch(name))
    chosen = select_plans([r.trace for r in runs if r.trace], ids, warm, rehearsal_batch(name))
    assert [(t.task.id, t.rounds[0].plan.steps[0].agent) for t in chosen.plans  # type: ignore[union-attr]
            ] == [(never.id, "alpha"), (wrote.id, "alpha")]
    prompt = chosen.plans[0].rounds[0].attempts[-1].prompt
    assert [m.content for m in prompt] == [f"Plan: {never.question}"]
    assert (w.plans, w.tasks_with_plans, w.conductors, w.shapes) == (
        2, 2, {policy: 2}, {"1 step": 2})
    own = [t.reward.value for t in rehearsed if t.task.id == never.id and t.reward]
    assert w.mean_plan_reward == pytest.approx((sum(own) / 4 + chosen.plan_means[
        chosen.plans[1].workflow_id, chosen.plans[1].run_id]) / 2)


@pytest.mark.slow  # about 60 s: two rounds of 8 samples and rehearsals, two warm-ups, one update
async def test_warm_up_rounds_sample_from_the_last_rounds_version_and_rehearse_only_new_plans(
    client: Client, settings: Settings, tiny_policy_dir: Path, trace_store: TraceStore,
) -> None:
    """Two rounds of expert iteration on two sim tasks with nothing stored before: each round
    samples every training task 6 times by the newest version (round 0 by base, round 1 by
    the v1 round 0 published), the 2 before the last with their first step's agent forced to
    the pool's first two agents, the last 2 with a two-step shape forced in turn, then
    rehearses candidate plans no earlier round rehearsed, then fine-tunes and publishes: v1
    from base, v2 from v1, each under its round's idempotency key, each answered by the
    held-out task; GRPO's iteration 0 samples with v2. Each round runs in a run of its own
    (continue-as-new), and the last run's history replays."""
    from temporalio.worker import Replayer

    from conductor_engine.engine.contracts.names import (
        rehearsal_batch,
        warmup_batch,
        warmup_sample_workflow_id,
    )
    from conductor_engine.engine.contracts.plan_shapes import shape_of, warmup_forced_shape
    from conductor_engine.engine.storage.payloads import data_converter
    from conductor_engine.trainer.warmup import plan_signature
    from conductor_engine.workflows.train import WARMUP_SAMPLES_FROM, TrainingWorkflow

    settings = trainer_settings(settings)
    pool = sim_pool(str(tiny_policy_dir))
    policy = pool.conductor.id
    tasks = [revised(t, options=revised(t.options, max_steps=2)) for t in sim_tasks()]
    train, held = tasks[:2], tasks[3:]
    warm = WarmupConfig(enabled=True, epochs=1, learning_rate=3e-3, conductors=[policy],
                        correct_only=False, rounds=2, samples=6, force_shapes=1 / 3,
                        force_agents=1 / 3, rehearse=2, rehearse_plans=2)
    recipe = Recipe(
        policy=PolicyConfig(base=str(tiny_policy_dir), lora=False),
        loss=LossConfig(learning_rate=1e-3, micro_batch_size=8),
        rollouts=RolloutConfig(group_size=2, groups_per_update=2, max_staleness=0),
        heldout=HeldOutConfig(every=1), warmup=warm)
    name = f"rounds-{uuid.uuid4().hex[:6]}"
    agents = [a.id for a in pool.agents]
    inp = TrainInput(name=name, policy=policy, tasks=train, heldout_tasks=held, iterations=1,
                     recipe=recipe, trainer_task_queue=settings.trainer_task_queue,
                     agents=agents)
    async with training_stack(client, settings, pool) as conductor:
        await conductor.start_training(inp)
        handle = client.get_workflow_handle(training_workflow_id(name), result_type=TrainProgress)
        final: TrainProgress = await asyncio.wait_for(handle.result(), timeout=900)
        history = await handle.fetch_history()
        runs = [w async for w in client.list_workflows(
            f'WorkflowId = "{training_workflow_id(name)}"')]

    print("rounds:", [w.model_dump_json() for w in final.warmup_rounds])
    assert [w.round for w in final.warmup_rounds] == [0, 1]
    assert final.warmup == final.warmup_rounds[1]
    for w in final.warmup_rounds:
        assert w.sampling is not None and w.rehearsal is not None and w.published, w
        assert w.sampling.runs + sum(w.sampling.left_out.values()) == 12
    assert [w.version for w in final.warmup_rounds] == [1, 2]
    assert [s.version for s in final.history] == ["v2"] and final.version == 3
    assert [e.version for e in final.evals] == ["base", "v1", "v2", "v3"]
    assert len(runs) == 2, "round 0, then round 1 and the iteration in a run of their own"

    registry = PolicyRegistry(trace_store.pool)
    v1, v2 = await registry.get(policy, 1), await registry.get(policy, 2)
    assert (v1.parent, v2.parent) == (0, 1)
    assert v1.metrics["phase"] == v2.metrics["phase"] == "warmup"
    wid = training_workflow_id(name)
    assert (v1.update_id, v2.update_id) == (warmup_id(wid, 0), warmup_id(wid, 1))

    samples = await trace_store.batch_traces(warmup_batch(name))
    assert len(samples) == 24
    forced = forced_agents = 0
    for t in samples:
        k, i = divmod(t.task.sampling.sample - WARMUP_SAMPLES_FROM, 1_000)
        assert t.workflow_id.endswith(warmup_sample_workflow_id(name, "x", k, t.task.id, i)
                                      .split("/x/", 1)[1])
        assert t.policy.version == ("base" if k == 0 else "v1")
        assert t.task.id in {x.id for x in train} and t.task.sampling.explore == warm.explore
        want = warmup_forced_shape(t.task.options.max_steps, i, 6, 2)
        assert t.task.sampling.force_shape == (None if want is None else ",".join(want))
        asked = {2: agents[0], 3: agents[1]}.get(i)
        assert t.task.sampling.force_agent == asked
        attempt = t.rounds[0].attempts[0]
        if asked is not None:
            assert t.rounds[0].plan is not None and t.rounds[0].plan.steps[0].agent == asked
            assert attempt.forced_agent == asked and attempt.json_schema is not None
            forced_agents += 1
        if want is not None:
            assert shape_of(attempt.raw_text or "") == want
            # kept so that the warm-up can learn the shape (trainer/reconstruct.py `unshape`)
            assert attempt.forced_shape == ",".join(want) and attempt.json_schema is not None
            forced += 1
        elif asked is None:
            assert attempt.forced_shape is None and attempt.json_schema is None
    assert forced == 8, "2 of each task's 6 samples in each round"
    assert forced_agents == 8 and sum(w.sampling.forced_agents for w in final.warmup_rounds
                                      if w.sampling) == 8

    rehearsed = await trace_store.batch_traces(rehearsal_batch(name))
    by_round: dict[int, set[tuple[str, object]]] = {0: set(), 1: set()}
    for t in rehearsed:
        k = 1 if "/rehearse-r1/" in t.workflow_id else 0
        by_round[k].add((t.task.id, plan_signature(t)))
    assert by_round[0] and not by_round[0] & by_round[1], "a plan rehearsed twice"
    await Replayer(workflows=[TrainingWorkflow], data_converter=data_converter(settings)
                   ).replay_workflow(history)


async def test_the_store_ranks_each_tasks_runs_by_reward_then_cost_and_never_a_forged_verdict(
    trace_store: TraceStore,
) -> None:
    """`TraceStore.best_runs`, the warm-up's candidates: per task the best completed runs with
    a reward (higher reward, then cheaper), none whose verdict the candidate could have forged,
    none of another task (a held-out run of the same task included), none of a fixed plan."""
    from tests.unit.trainer.test_warmup import scored

    a, b = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    runs = {
        "forged": scored(a, 1.0, cost=0.0, trusted=False),
        "best": scored(a, 0.98, cost=0.02, minute=1),
        "dearer": scored(a, 0.98, cost=0.05),
        "held-out": scored(f"heldout~{a}", 1.0, cost=0.0),
        "invalid": scored(b, 1.0, status="invalid_plan"),
        "wrong": scored(b, 0.25, correct=False),
        "b": scored(b, 0.9),
        "fixed": scored(b, 1.0, conductor="baseline"),  # a fixed plan's run: nothing to learn
    }
    for trace in runs.values():
        await trace_store.write(trace)

    def ids(found: list[StoredRun]) -> list[str]:
        return [r.workflow_id for r in found]

    assert ids(await trace_store.best_runs([a, b], per_task=1)) == [
        runs["best"].workflow_id, runs["b"].workflow_id]
    assert ids(await trace_store.best_runs([a], per_task=5)) == [
        runs["best"].workflow_id, runs["dearer"].workflow_id]
    assert ids(await trace_store.best_runs([b], per_task=5, correct_only=True)) == [
        runs["b"].workflow_id]
    assert ids(await trace_store.best_runs([b], per_task=5, min_reward=0.95)) == []
    assert await trace_store.best_runs([a], per_task=1, policies=["nobody"]) == []


async def test_the_store_gives_each_tasks_newest_scored_runs_right_and_wrong_and_its_rehearsals(
    trace_store: TraceStore,
) -> None:
    """`TraceStore.scored_runs`, the evidence of plan means: per task the newest completed
    runs with a reward, wrong ones included, none forged, none of a held-out run; with
    `policies`, those conductors' runs and every run of the rehearsal batch."""
    from tests.unit.trainer.test_warmup import scored

    a = f"a-{uuid.uuid4().hex[:6]}"
    runs = {f"m{m}": scored(a, 1.0 if m % 2 else 0.5, correct=bool(m % 2), minute=m)
            for m in range(4)}
    runs["forged"] = scored(a, 1.0, trusted=False, minute=9)
    runs["held-out"] = scored(f"heldout~{a}", 1.0, minute=9)
    runs["invalid"] = scored(a, 0.0, status="invalid_plan", minute=9)
    runs["other"] = scored(a, 1.0, conductor="someone", minute=8)
    runs["rehearsed"] = scored(a, 1.0, conductor="baseline", minute=7)
    runs["rehearsed"].task.batch = "rehearse-x"
    for trace in runs.values():
        await trace_store.write(trace)

    async def ids(**kw: object) -> list[str]:
        found = await trace_store.scored_runs([a], **kw)  # type: ignore[arg-type]
        return [r.workflow_id for r in found]

    def wid(*keys: str) -> list[str]:
        return [runs[k].workflow_id for k in keys]

    assert await ids(per_task=3) == wid("other", "rehearsed", "m3")
    assert await ids(per_task=10, policies=["teacher"]) == wid("m3", "m2", "m1", "m0")
    assert await ids(per_task=2, policies=["teacher"], batch="rehearse-x") == wid(
        "rehearsed", "m3")


async def test_a_rehearsal_larger_than_one_training_run_holds_is_refused_before_any_plan(
    settings: Settings, trace_store: TraceStore,
) -> None:
    """Four tasks with sixteen right plans each, rehearsed 64 times: 4,096 runs, over the
    4,000 one training run holds; the trainer refuses in one line before returning any plan,
    and the same with 62 repeats passes (3,968 runs)."""
    from conductor_engine.engine.contracts.training import WarmupRequest
    from conductor_engine.trainer.service import RehearsalTooLarge, Trainer
    from tests.unit.trainer.test_warmup import planned

    ids = [f"big-{uuid.uuid4().hex[:6]}" for _ in range(4)]
    agents = [f"agent{i}" for i in range(4)]
    for task_id in ids:
        for a in agents:
            for b in agents:
                await trace_store.write(planned(task_id, ((a, []), (b, [0])), 1.0))

    def asked(rehearse: int) -> WarmupRequest:
        warm = WarmupConfig(enabled=True, conductors=["teacher"], rehearse=rehearse,
                            rehearse_plans=16)
        return WarmupRequest(name="nobody", parent=0, update_id="x", task_ids=ids,
                             recipe=Recipe(warmup=warm), rehearsal_batch="rehearse-nobody")

    trainer = Trainer(settings)
    with pytest.raises(RehearsalTooLarge, match="would start 4,096 runs, over the 4,000 one "
                       "training run holds: lower \\[warmup\\] rehearse or rehearse_plans"):
        await trainer.rehearsal_plans(asked(64))
    plans = (await trainer.rehearsal_plans(asked(62))).plans
    assert sorted(plans) == sorted(ids) and {len(p) for p in plans.values()} == {16}
