"""TrainingWorkflow: the conductor learns from its own rollouts, one GRPO iteration per run.

    pick tasks ─▶ G ConductWorkflow rollouts per task at the recipe's temperature, pinned to K
               ─▶ wait ─▶ grpo_update on the trainer task queue ─▶ version K+1 published
               ─▶ continue-as-new (one iteration per run keeps every history short)

Rollouts are ordinary conductor runs: they record traces, and the trainer reads its groups from
the trace store, not from this workflow. So the update is an activity like any other: when the
trainer dies mid-update, Temporal runs it again on the next trainer (heartbeat timeout), and the
registry's transaction makes sure the groups are consumed once. A `stop` signal ends the run at
the next iteration boundary; `conductor train start` with the same name resumes from there.
In `from_traces` mode there are no rollouts: each iteration trains on groups already stored,
until none is left.

Temporal's limits hold by construction (engine/contracts/limits.py): rollouts start only
inside a semaphore of `concurrency` (≤ 2,000) slots, so however many an iteration gathers
(group_size × groups_per_update), no more children than that are pending at once, and they
start in waves that each fit in one workflow task (workflows/children.py); the tasks are
in the blob store and the input, carried at every continue-as-new, holds only a reference to
them (`task_list`); and each rollout returns a summary of its run (a few KB), not the whole run,
which the trainer reads from the trace store.

A rollout is an honest sample of the policy: one plan attempt (a malformed plan scores 0, as in
the paper, and no trained prompt holds retry feedback), and a run that failed for infrastructure
reasons, or whose verifier failed, is left out of its group and counted by reason
(engine/rewards/rollouts.py), never scored 0.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError, CancelledError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from conductor_engine.engine.contracts.limits import (
        MAX_WARMUP_SAMPLES,
        TRAINING_PLAN_DEADLINE_S,
    )
    from conductor_engine.engine.contracts.names import (
        PROGRESS_QUERY,
        REHEARSAL_PLANS_ACTIVITY,
        STOP_SIGNAL,
        TRAINING_WORKFLOW,
        UPDATE_ACTIVITY,
        WARMUP_ACTIVITY,
        heldout_batch,
        heldout_workflow_id,
        rehearsal_batch,
        rehearsal_workflow_id,
        rollout_workflow_id,
        update_id,
        warmup_batch,
        warmup_id,
        warmup_sample_workflow_id,
    )
    from conductor_engine.engine.contracts.plan_shapes import (
        forced_rollouts,
        forced_shape,
        warmup_forced_shape,
    )
    from conductor_engine.engine.contracts.plans import Plan
    from conductor_engine.engine.contracts.policy_versions import version_label
    from conductor_engine.engine.contracts.records import RunResult
    from conductor_engine.engine.contracts.strict import revised
    from conductor_engine.engine.contracts.tasks import Task, rollout_sampling
    from conductor_engine.engine.contracts.training import (
        Recipe,
        Rehearsal,
        RehearsalPlans,
        UpdateRequest,
        UpdateResult,
        WarmupRequest,
        WarmupResult,
        WarmupSampling,
        group_agents,
    )
    from conductor_engine.engine.contracts.training_runs import (
        HeldOutEval,
        IterationStats,
        TrainInput,
        TrainProgress,
    )
    from conductor_engine.engine.rewards.rollouts import (
        LeftOutReason,
        count_reasons,
        ended_reason,
        run_left_out,
    )
    from conductor_engine.workflows.children import (
        START_WAVES_PATCH,
        ChildOutcome,
        FanOut,
        StartWaves,
    )
    from conductor_engine.workflows.tasks import read_tasks

# Training runs started from here on rehearse candidate plans before the warm-up when the recipe
# asks (`[warmup] rehearse`); a recipe recorded before that has no such setting.
REHEARSAL_PATCH = "warmup-rehearsal"

REHEARSAL_SAMPLES_FROM = 1_000_000
"""The sample number of a rehearsal's first repeat: above any rollout's (`rollout_draw`),
so a rehearsal draws afresh rather than repeating the run it rehearses (the sim provider seeds
an agent's answer with the sample)."""

WARMUP_SAMPLES_FROM = 2_000_000
"""The sample number of the first warm-up sample; round r's sample i is this + 1,000 r + i,
apart from rollouts', rehearsals' and other rounds' draws."""

# Rollouts started from here on draw under a sample number that counts up across iterations
# (`rollout_draw`); before, every iteration's rollout k drew under sample k.
ROLLOUT_DRAWS_PATCH = "rollout-draws-per-iteration"


def rollout_draw(iteration: int, sample: int, group_size: int) -> int:
    """The sample number rollout `sample` of iteration `iteration` runs under: iteration x
    group_size + sample, below REHEARSAL_SAMPLES_FROM. The sim provider seeds an agent's answer
    with (task, agent, sample, attempt), as the local conductor seeds its plan; under the
    in-group index alone every iteration's rollout k of a task drew the same answers, so a
    plan written greedily met the same draws each iteration: GRPO could learn those draws, and
    plan means (`[rollouts] reward = "plan_mean"`) counted one draw as many runs (structured
    pool 3: a one-step review plan's rollouts 1 and 3 at iteration 3 repeated iteration 0's
    right answers). Replays stay exact: the number depends on the iteration and the group only."""
    return (iteration * group_size + sample) % REHEARSAL_SAMPLES_FROM


# Rollouts started from here on get one plan attempt; an iteration already under way when this
# shipped replays, and finishes, with the attempts it started with.
ONE_PLAN_ATTEMPT_PATCH = "one-plan-attempt-rollouts"


def pick_tasks(tasks: list[Task], iteration: int, k: int) -> list[Task]:
    """The iteration's tasks: the next k of the list, wrapping round (the CLI shuffles it)."""
    if not tasks:
        return []
    start = iteration * k
    return [tasks[(start + i) % len(tasks)] for i in range(min(k, len(tasks)))]


def pick_ranges(total: int, iteration: int, k: int) -> list[tuple[int, int]]:
    """`pick_tasks` as (offset, count) ranges of a list of `total` tasks: one, or two where
    the pick wraps round."""
    if not total:
        return []
    start, count = (iteration * k) % total, min(k, total)
    first = min(count, total - start)
    return [(start, first)] + ([(0, count - first)] if count > first else [])


def _on_the_trainer(inp: TrainInput) -> dict[str, Any]:
    """The activity options of the trainer's work (an update, the warm-up): its queue, the run's
    timeouts, and no retry of a stale parent or a policy error, which a retry cannot mend."""
    return {
        "task_queue": inp.trainer_task_queue,
        "start_to_close_timeout": timedelta(seconds=inp.update_timeout_s),
        "heartbeat_timeout": timedelta(seconds=inp.update_heartbeat_s),
        "retry_policy": RetryPolicy(maximum_interval=timedelta(seconds=30),
                                    non_retryable_error_types=["StaleParent", "PolicyError"]),
    }


@workflow.defn(name=TRAINING_WORKFLOW)
class TrainingWorkflow:
    def __init__(self) -> None:
        self._progress = TrainProgress()

    @workflow.query(name=PROGRESS_QUERY)
    def progress(self) -> TrainProgress:
        return self._progress

    @workflow.signal(name=STOP_SIGNAL)
    def stop(self) -> None:
        """Finish the iteration in flight, then end (resumable with `train start`)."""
        self._progress.stop_requested = True

    @workflow.run
    async def run(self, inp: TrainInput) -> TrainProgress:
        p = self._progress = inp.progress
        if p.stop_requested or p.iteration >= inp.iterations:
            p.phase = "stopped" if p.iteration < inp.iterations else "finished"
            return p
        if self._evaluates(inp) and not p.evals:  # where training starts from
            await self._heldout(inp)
        if inp.recipe.warmup.enabled and p.warmup is None and p.iteration == 0:
            # once: a resumed run carries p.warmup (and the rounds done in p.warmup_rounds)
            await self._warmup(inp)
            if p.warmup is None:  # another round to go, in a run of its own: short histories
                workflow.continue_as_new(revised(inp, progress=p))
        stats = IterationStats(iteration=p.iteration, version=p.label)
        recipe = inp.recipe
        if not inp.from_traces:
            p.phase = "rollouts"
            tasks = await self._pick(inp, recipe.rollouts.groups_per_update)
            started = workflow.time()
            await self._rollouts(inp, tasks, stats)
            stats.rollout_seconds = workflow.time() - started
            rollouts = revised(recipe.rollouts, task_ids=[t.id for t in tasks])
            recipe = revised(recipe, rollouts=rollouts)
        p.phase = "update"
        result = await self._update(inp, recipe)
        self._record(stats, result, inp.from_traces)
        p.history.append(stats)
        p.version = result.version
        p.iteration += 1
        last = p.stop_requested or p.iteration >= inp.iterations
        if self._evaluates(inp) and result.published and (
                p.iteration % inp.recipe.heldout.every == 0 or last):
            await self._heldout(inp)
        if inp.from_traces and not result.published:
            p.phase = "finished"  # every stored group is trained on
            return p
        if p.stop_requested or p.iteration >= inp.iterations:
            p.phase = "stopped" if p.stop_requested else "finished"
            return p
        workflow.continue_as_new(revised(inp, progress=p))

    async def _pick(self, inp: TrainInput, k: int) -> list[Task]:
        """The iteration's tasks: from the inline list when there is one (the input of an
        older client), else read from the task list."""
        iteration = self._progress.iteration
        if inp.tasks or inp.task_list is None:
            return pick_tasks(inp.tasks, iteration, k)
        listed = inp.task_list
        return [task for offset, count in pick_ranges(listed.total, iteration, k)
                for task in await read_tasks(listed, offset, count)]

    async def _rollouts(self, inp: TrainInput, tasks: list[Task], stats: IterationStats) -> None:
        """G runs of each task at the rollout temperature, pinned to the current version, one
        plan attempt each; the figures are over the runs that are rollouts."""
        p, g = self._progress, inp.recipe.rollouts.group_size
        chain = workflow.info().first_execution_run_id[:8]
        one_attempt = workflow.patched(ONE_PLAN_ATTEMPT_PATCH)
        fresh_draws = workflow.patched(ROLLOUT_DRAWS_PATCH)
        children = FanOut(inp.concurrency, StartWaves(enabled=workflow.patched(START_WAVES_PATCH)))
        rewards: list[float] = []
        valid: list[bool] = []
        left_out: list[LeftOutReason] = []
        drawn = self._drawn_agents(inp, tasks)

        cfg = inp.recipe.rollouts
        n_forced, rescue = forced_rollouts(cfg.force_shapes, cfg.force_shapes_iterations,
                                           p.iteration, g) if cfg.force_shapes else (0, False)
        answered: set[str] = set()  # tasks with an unforced rollout that answered right

        async def rollout(task: Task, sample: int) -> None:
            shape = forced_shape(task.options.max_steps, sample, g, n_forced)
            if rescue and shape is not None and task.id in answered:
                shape = None  # forced only where every unforced rollout failed
            if (task.id, sample) in drawn:  # the run's agents: the group's, or its own draw
                task = revised(task, agents=drawn[task.id, sample])
            options = revised(  # the trainer reads the whole run from its trace: a summary
                task.options, temperature=inp.temperature, policy_version=p.version,
                result="summary", plan_deadline_s=TRAINING_PLAN_DEADLINE_S)
            if one_attempt:
                options = revised(options, max_plan_attempts=1)
            sampling = rollout_sampling(
                rollout_draw(p.iteration, sample, g) if fresh_draws else sample,
                explore=cfg.explore, explore_importance=cfg.explore_importance,
                force_shape=None if shape is None else ",".join(shape))
            task = revised(task, options=options, sampling=sampling)
            wid = rollout_workflow_id(inp.name, chain, p.iteration, task.id, sample)
            res = _collected(await children.run(task, wid, f"rollout {sample} · {inp.name} "
                                                           f"it{p.iteration}"))
            if res is None:
                return  # ran before a reset of this workflow: its trace is in the store
            if isinstance(res, RunResult):
                stats.tokens += res.totals.usage.input_tokens + res.totals.usage.output_tokens
            reason = _unscored(res)
            if reason is not None:
                left_out.append(reason)
                return
            assert isinstance(res, RunResult) and res.reward and res.reward.value is not None
            rewards.append(res.reward.value)
            valid.append(res.status != "invalid_plan")
            if shape is None and res.reward.verdict is not None and res.reward.verdict.correct:
                answered.add(task.id)

        if rescue:  # the unforced first: whether a group is forced depends on them
            await asyncio.gather(*(rollout(task, sample) for task in tasks
                                   for sample in range(g - n_forced)))
            await asyncio.gather(*(rollout(task, sample) for task in tasks
                                   for sample in range(g - n_forced, g)))
        else:
            await asyncio.gather(*(rollout(task, sample) for task in tasks
                                   for sample in range(g)))
        stats.rollouts = len(rewards)
        stats.left_out = count_reasons(left_out)
        if rewards:
            stats.mean_reward = sum(rewards) / len(rewards)
            stats.valid_plan_rate = sum(valid) / len(valid)

    @staticmethod
    def _evaluates(inp: TrainInput) -> bool:
        return bool(inp.heldout_tasks or inp.heldout_list) and not inp.from_traces

    async def _heldout(self, inp: TrainInput) -> None:
        """The current version on every held-out task, at the held-out temperature (greedy by
        default), each run seeded, pinned to the version and labelled with the batch
        `heldout-NAME-vK`; the figures go to progress.evals. A held-out run's task id is
        `heldout~ID`, so it never joins a training group of the task it came from."""
        p, cfg = self._progress, inp.recipe.heldout
        p.phase = "heldout"
        label = p.label
        batch = heldout_batch(inp.name, label)
        if inp.heldout_tasks or inp.heldout_list is None:
            tasks = list(inp.heldout_tasks)
        else:
            tasks = await read_tasks(inp.heldout_list, 0, inp.heldout_list.total)
        chain = workflow.info().first_execution_run_id[:8]
        children = FanOut(inp.concurrency, StartWaves(enabled=True))
        rewards: list[float] = []
        correct: list[bool] = []
        valid: list[bool] = []
        left_out: list[LeftOutReason] = []

        async def one(task: Task) -> None:
            options = revised(task.options, temperature=cfg.temperature, policy_version=p.version,
                              result="summary", max_plan_attempts=1,
                              plan_deadline_s=TRAINING_PLAN_DEADLINE_S)
            task = revised(task, id=f"heldout~{task.id}", batch=batch, options=options,
                           sampling=rollout_sampling(0))
            wid = heldout_workflow_id(inp.name, chain, label, task.id)
            res = _scored(await children.run(task, wid, f"held out · {inp.name} {label}"),
                          left_out)
            if res is None or res.reward is None or res.reward.value is None:
                return
            rewards.append(res.reward.value)
            verdict = res.reward.verdict
            correct.append(bool(verdict is not None and verdict.correct))
            valid.append(res.status != "invalid_plan")

        await asyncio.gather(*(one(t) for t in tasks))
        n = len(rewards)
        p.evals.append(HeldOutEval(
            iteration=p.iteration, version=label, batch=batch, runs=n,
            accuracy=sum(correct) / n if n else None, mean_reward=sum(rewards) / n if n else None,
            valid_plan_rate=sum(valid) / n if n else None, left_out=count_reasons(left_out)))

    def _drawn_agents(self, inp: TrainInput, tasks: list[Task]
                      ) -> dict[tuple[str, int], list[str]]:
        """Each rollout's agents by (task id, sample), where the recipe varies the pool: a
        random subset (and order) of the pool, or of the task's own `agents`, one draw per
        group or per rollout (`vary_pool_per`), from (recipe seed, name, iteration, task
        id[, sample]) alone (engine/contracts/training.py `group_agents`), so a replay or a
        rerun draws the same. The rollouts' tasks carry it, so each trace records the agents
        its conductor was offered (and its recorded prompt shows them)."""
        cfg = inp.recipe.rollouts
        if not cfg.varies_pool:
            return {}
        out: dict[tuple[str, int], list[str]] = {}
        for task in tasks:
            pool = task.agents or inp.agents
            if not pool:
                raise ApplicationError(
                    "the recipe varies the pool (pool_subset_min/max, shuffle_pool) but the "
                    "training input lists no agents to draw from; start it with `conductor "
                    "train start` or fill TrainInput.agents from the pool",
                    type="NoPoolAgents", non_retryable=True,
                )
            for sample in range(cfg.group_size):
                agents = group_agents(pool, cfg, seed=inp.recipe.seed, name=inp.name,
                                      iteration=self._progress.iteration, task_id=task.id,
                                      sample=sample)
                if agents is not None:
                    out[task.id, sample] = agents
        return out

    async def _warmup(self, inp: TrainInput) -> None:
        """One round of the warm-up on scored plans of the training tasks (trainer/warmup.py),
        on the trainer's queue like an update: after the round's exploring samples and the
        rehearsal of its candidate plans, when the recipe asks for them. The last round's
        result is p.warmup; GRPO continues from the version it publishes, which the held-out
        tasks answer first when they are evaluated (as they answer every round's).

        Rounds are expert iteration: each samples from the version the last one published,
        so its candidates gather where the last round's best plans were, and the ranking reads
        every counted run so far (docs/concepts/grpo.md). A recipe recorded before rounds and
        samples existed has one round and no samples: its history replays unchanged."""
        p, cfg = self._progress, inp.recipe.warmup
        k = len(p.warmup_rounds)
        req = WarmupRequest(
            name=inp.policy, parent=p.version, recipe=inp.recipe,
            update_id=warmup_id(workflow.info().workflow_id, k),
            task_ids=[t.id for t in inp.tasks], task_list=None if inp.tasks else inp.task_list)
        sampling = await self._sample(inp, k) if cfg.samples_per_round else None
        rehearsal = None
        # a recipe recorded before rehearsals existed has none: its history replays unchanged
        if cfg.rehearses and workflow.patched(REHEARSAL_PATCH):
            req = revised(req, rehearsal_batch=rehearsal_batch(inp.name))
            rehearsal = await self._rehearse(inp, req, k)
        p.phase = "warmup"
        rounds = f" round {k + 1}/{cfg.rounds}" if cfg.rounds > 1 else ""
        result = await workflow.execute_activity(
            WARMUP_ACTIVITY, req, result_type=WarmupResult,
            **_on_the_trainer(inp),
            summary=f"warm-up{rounds} · {inp.policy} {p.label} → v{p.version + 1}",
        )
        result.rehearsal, result.sampling, result.round = rehearsal, sampling, k
        p.warmup_rounds.append(result)
        if k + 1 >= cfg.rounds:
            p.warmup = result
        if result.published:
            p.version = result.version
            if self._evaluates(inp):
                await self._heldout(inp)

    async def _training_tasks(self, inp: TrainInput) -> list[Task]:
        """Every training task: the inline list, or the whole task list read back."""
        if inp.tasks or inp.task_list is None:
            return list(inp.tasks)
        return await read_tasks(inp.task_list, 0, inp.task_list.total)

    async def _sample(self, inp: TrainInput, k: int) -> WarmupSampling:
        """Round k's exploring samples: `samples` runs of every training task by the current
        version, at the rollouts' temperature with the warm-up's `explore`, the last
        round(force_shapes x samples) of each with a multi-step shape forced in turn and the
        round(force_agents x samples) before them with their first step's agent forced, each
        agent of the task's pool in turn (WarmupConfig.forced_agent), one plan attempt each,
        the task's own pool, labelled with the run's warm-up batch. They are ordinary conductor
        runs, scored and stored; the warm-up ranks their plans with the rest. Refused before
        any run starts where the round would start more than
        limits.py MAX_WARMUP_SAMPLES."""
        p, cfg = self._progress, inp.recipe.warmup
        tasks = await self._training_tasks(inp)
        n, n_forced = cfg.samples_per_round, cfg.forced_samples()
        if len(tasks) * n > MAX_WARMUP_SAMPLES:
            raise ApplicationError(
                f"a warm-up round would start {len(tasks) * n:,} samples ({len(tasks):,} "
                f"training tasks x [warmup] samples = {n}), over the {MAX_WARMUP_SAMPLES:,} one "
                "round holds (engine/contracts/limits.py); lower [warmup] samples or train on "
                "fewer tasks", type="WarmupTooLarge", non_retryable=True)
        pools = {t.id: self._warmup_pool(inp, t) for t in tasks} if cfg.force_agents else {}
        p.phase = "warmup_samples"
        started = workflow.time()
        chain = workflow.info().first_execution_run_id[:8]
        children = FanOut(inp.concurrency, StartWaves(enabled=True))
        batch = warmup_batch(inp.name)
        out = WarmupSampling()
        rewards: list[float] = []
        left_out: list[LeftOutReason] = []

        async def one(task: Task, i: int) -> None:
            shape = warmup_forced_shape(task.options.max_steps, i, n, n_forced,
                                        live_only=cfg.dead_steps == "skip")
            agent = cfg.forced_agent(pools[task.id], i) if pools else None
            options = revised(task.options, temperature=inp.temperature,
                              policy_version=p.version, result="summary", max_plan_attempts=1,
                              plan_deadline_s=TRAINING_PLAN_DEADLINE_S)
            sampling = rollout_sampling(
                WARMUP_SAMPLES_FROM + 1_000 * k + i, explore=cfg.explore,
                explore_importance=inp.recipe.rollouts.explore_importance,
                force_shape=None if shape is None else ",".join(shape), force_agent=agent)
            run = revised(task, batch=batch, options=options, sampling=sampling)
            wid = warmup_sample_workflow_id(inp.name, chain, k, task.id, i)
            outcome = await children.run(run, wid, f"warm-up sample · {inp.name} r{k}")
            collected = _collected(outcome)
            if isinstance(collected, RunResult):
                u = collected.totals.usage
                out.tokens += u.input_tokens + u.output_tokens
            res = _scored(outcome, left_out)
            if res is None or res.reward is None or res.reward.value is None:
                return
            rewards.append(res.reward.value)
            out.forced += shape is not None
            out.forced_agents += agent is not None

        await asyncio.gather(*(one(task, i) for task in tasks for i in range(n)))
        out.runs, out.left_out = len(rewards), count_reasons(left_out)
        out.mean_reward = sum(rewards) / len(rewards) if rewards else None
        out.seconds = workflow.time() - started
        return out

    @staticmethod
    def _warmup_pool(inp: TrainInput, task: Task) -> list[str]:
        """The agents a task's warm-up samples are forced to in turn ([warmup] force_agents):
        its own `agents`, or the training input's pool, in their order."""
        pool = task.agents or inp.agents
        if not pool:
            raise ApplicationError(
                "[warmup] force_agents forces each agent of the pool in turn, but the training "
                "input lists no agents; start it with `conductor train start` or fill "
                "TrainInput.agents from the pool", type="NoPoolAgents", non_retryable=True)
        return list(pool)

    async def _rehearse(self, inp: TrainInput, req: WarmupRequest, k: int) -> Rehearsal:
        """Each training task's best candidate plans (asked of the trainer, which reads the
        store and refuses more runs than limits.py MAX_REHEARSAL_RUNS), each run `rehearse`
        more times as a fixed plan (Task.plan, as `conductor eval` runs its baselines), as
        child runs like rollouts, labelled with the run's rehearsal batch. They are scored
        and recorded like any run, and the warm-up counts their rewards towards their plan's
        mean. Repeat r of every plan of a task is sample REHEARSAL_SAMPLES_FROM + r: apart
        from the samples rollouts use, and the same for every plan of the task, so plans are
        compared on the same draws. Round k (from 0) rehearses the plans no earlier round
        did."""
        p, cfg = self._progress, inp.recipe.warmup
        p.phase = "rehearsal"
        started = workflow.time()
        candidates = await workflow.execute_activity(
            REHEARSAL_PLANS_ACTIVITY, req, result_type=RehearsalPlans,
            **_on_the_trainer(inp), summary=f"rehearsal plans · {inp.policy}")
        tasks = await self._training_tasks(inp)
        batch = rehearsal_batch(inp.name)
        chain = workflow.info().first_execution_run_id[:8]
        children = FanOut(inp.concurrency, StartWaves(enabled=True))
        rewards: list[float] = []
        left_out: list[LeftOutReason] = []

        async def one(task: Task, plan_no: int, plan: Plan, r: int) -> None:
            options = revised(task.options, plan=plan, refinement_rounds=0, result="summary",
                              max_plan_attempts=1)
            run = revised(task, batch=batch, options=options,
                          sampling=rollout_sampling(REHEARSAL_SAMPLES_FROM + r))
            wid = rehearsal_workflow_id(inp.name, chain, task.id, plan_no, r, k)
            res = _scored(await children.run(run, wid, f"rehearsal · {inp.name}"), left_out)
            if res is None or res.reward is None or res.reward.value is None:
                return
            rewards.append(res.reward.value)

        await asyncio.gather(*(one(task, plan_no, plan, r) for task in tasks
                               for plan_no, plan in enumerate(candidates.plans.get(task.id, []))
                               for r in range(cfg.rehearse)))
        return Rehearsal(
            tasks=sum(1 for t in tasks if candidates.plans.get(t.id)),
            plans=sum(len(candidates.plans.get(t.id, [])) for t in tasks), runs=len(rewards),
            mean_reward=sum(rewards) / len(rewards) if rewards else None,
            left_out=count_reasons(left_out), seconds=workflow.time() - started)

    async def _update(self, inp: TrainInput, recipe: Recipe) -> UpdateResult:
        p = self._progress
        info = workflow.info()
        req = UpdateRequest(
            name=inp.policy, parent=p.version, recipe=recipe,
            update_id=update_id(info.workflow_id, info.first_execution_run_id, p.iteration),
            reference=self._reference(recipe),
            rehearsal_batch=rehearsal_batch(inp.name)
            if recipe.rollouts.reward == "plan_mean" else None,
        )
        return await workflow.execute_activity(
            UPDATE_ACTIVITY, req, result_type=UpdateResult,
            **_on_the_trainer(inp),
            summary=f"grpo_update · {inp.policy} {p.label} → v{p.version + 1}",
        )

    def _reference(self, recipe: Recipe) -> int | None:
        """What the KL term measures against: the version the warm-up left GRPO to start from
        (LossConfig.beta), when there is a KL term and a warm-up published that version;
        otherwise None, the base."""
        warmup = self._progress.warmup
        if recipe.loss.beta == 0 or warmup is None or warmup.version == 0:
            return None
        return warmup.version

    def _record(self, stats: IterationStats, result: UpdateResult, from_traces: bool) -> None:
        if from_traces:  # no rollouts of its own: the groups' figures
            stats.rollouts, stats.mean_reward = result.rollouts, result.mean_reward
            stats.valid_plan_rate, stats.tokens = result.valid_plan_rate, result.rollout_tokens
            stats.left_out = result.left_out
        stats.update_left_out = result.left_out
        stats.published = version_label(result.version) if result.published else None
        stats.update_seconds = result.seconds
        stats.note = result.reason
        if result.step is not None:
            s = result.step
            stats.loss, stats.clip_fraction, stats.kl = s.loss, s.clip_fraction, s.kl
            stats.grad_norm, stats.trained_tokens = s.grad_norm, s.tokens


def _collected(outcome: ChildOutcome) -> RunResult | LeftOutReason | None:
    """A training child's outcome (a rollout or a held-out run): its result (a summary), why
    it failed, or None when a run of that id ran before a reset of this workflow (its trace is
    in the store)."""
    return _child_failure(outcome) if isinstance(outcome, ChildWorkflowError) else outcome


def _scored(outcome: ChildOutcome, left_out: list[LeftOutReason]) -> RunResult | None:
    """A held-out or rehearsal run whose reward counts, or None with why it does not appended
    to `left_out` (a run of that id from before a reset of this workflow counts as failed:
    these phases read rewards from results, not from the store)."""
    res = _collected(outcome)
    reason = "run_failed" if res is None else _unscored(res)
    if reason is not None:
        left_out.append(reason)
        return None
    assert isinstance(res, RunResult) and res.reward and res.reward.value is not None
    return res


def _child_failure(error: ChildWorkflowError) -> LeftOutReason:
    """Why a training child that ended in an exception is left out (rewards/rollouts.py)."""
    cause = error.cause
    return ended_reason(isinstance(cause, CancelledError),
                        cause.type if isinstance(cause, ApplicationError) else None)


def _unscored(res: RunResult | LeftOutReason) -> LeftOutReason | None:
    """Why a child's run says nothing about the policy, or None when its reward counts."""
    return res if not isinstance(res, RunResult) else run_left_out(res)
