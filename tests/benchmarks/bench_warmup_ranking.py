"""Which plans does each warm-up ranking pick? Exact expected rewards on structured sim pools.

    python -m tests.benchmarks.bench_warmup_ranking [--seeds 1,2,3] [--samples 8]
        [--two-step 0.21] [--rehearse 8] [--rehearse-plans 4] [--margin 0] [--repeats 20]
        [--draws exact|sim|sim-fresh] [--dead-steps learn|skip]

For each structured pool (`conductor sim pool --structure --seed S`, 32 tasks of four kinds) it
draws `--samples` scored runs of every task from a model of the base conductor exploring: a
two-step plan with probability `--two-step` (0.21: 41 of the 192 plans SmolLM2 wrote at
temperature 1 and epsilon 0.5 on pool 1, docs/results/learning.md), otherwise one step; agents
uniform, a second step seeing the first half the time. Each run is right with its plan's exact
probability (engine/providers/sim_structure.py `expected_reward`) and rewarded as scoring.py
rewards it (1 or `wrong`, less the cost penalty). Then the warm-up's own selection
(trainer/warmup.py `select_plans`, `candidate_plans`) picks each task's plan three ways:

- best run by reward (`rank = "run"`), the obvious baseline;
- plan mean over the same samples (`rank = "plan_mean"`);
- plan mean after a rehearsal: the `--rehearse-plans` best candidates of each task run
  `--rehearse` more times each, as fixed plans with fresh draws;
- the same by tag (`plan_means_by = "tag"`, as the plans recipe ships it): means pooled over
  the tasks of a kind, each task trained on the first plan of its kind's order it has a run of;
- the same, the cheaper of plans whose means are within `--ties` standard errors of their
  difference ranked first (`ties_within_se`).

It prints, per way, the selected plans' expected reward over the oracle's (summed over the tasks
with a selection), how many are the oracle's plan per kind, the selected plans' cost over the
oracle plans', and the runs executed, averaged over `--repeats` draws per pool; then the ratio
of each way's figure to the best run's.
`--draws sim` replaces the independent draws with the sim provider's own (SHA-256 of task,
agent, sample; a step answering with what it sees): the samples under the warm-up's sample
numbers, and a rehearsal's repeat r of every plan of a task under one number,
REHEARSAL_SAMPLES_FROM + r, as TrainingWorkflow runs it, so a task's plans share each agent's
draws; `--draws sim-fresh` gives each rehearsed plan numbers of its own. The two measure what
sharing the draws costs the ranking (one round: docs/results/warmup-ranking-draws.log).
`--dead-steps skip` ranks every way but the best run with `[warmup] dead_steps = "skip"` (a plan
whose second step does not see its first is neither learned nor rehearsed).
Seconds, no model, no services: the ranking in isolation from what SFT and GRPO make of it
(bench_plans.py measures those, with SmolLM2 writing the samples).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

from conductor_engine.engine.contracts.names import BASELINE_POLICY
from conductor_engine.engine.contracts.plans import Plan, Step
from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.contracts.traces import PolicyRef, Trace
from conductor_engine.engine.contracts.training import WarmupConfig
from conductor_engine.engine.providers.pool import Pool as AgentPool
from conductor_engine.engine.providers.sim_structure import (
    Oracle,
    PlanStep,
    StructuredPoolSpec,
    expected_reward,
    structured_pool_toml,
    structured_tasks,
)
from conductor_engine.trainer.warmup import candidate_plans, select_plans
from conductor_engine.workflows.train import REHEARSAL_SAMPLES_FROM, WARMUP_SAMPLES_FROM
from tests.unit.engine.providers.test_sim_structure import run_plan
from tests.unit.trainer.test_warmup import scored

BATCH = "rehearse-bench"
DRAWS = ("exact", "sim", "sim-fresh")
WAYS = ("best run by reward", "plan mean, samples only", "plan mean, rehearsed",
        "plan mean by tag, rehearsed", "by tag, cheaper of ties")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="1,2,3", help="comma-separated pool seeds")
    p.add_argument("--samples", type=int, default=8, help="scored runs of each task")
    p.add_argument("--two-step", type=float, default=41 / 192,
                   help="the share of two-step plans among the samples")
    p.add_argument("--rehearse", type=int, default=8)
    p.add_argument("--rehearse-plans", type=int, default=4)
    p.add_argument("--margin", type=float, default=0.0,
                   help="more_steps_margin of the rehearsed way (the plans recipe ships 0.1)")
    p.add_argument("--repeats", type=int, default=20, help="independent draws per pool")
    p.add_argument("--draws", choices=DRAWS, default="exact",
                   help="exact: each run right with its plan's exact probability, on its own; "
                   "sim: the sim provider's own draws, a rehearsal's repeat r of every plan of a "
                   "task under one sample number as TrainingWorkflow runs it (plans of a task "
                   "share an agent's draws); sim-fresh: the same, each rehearsed plan under "
                   "sample numbers of its own")
    p.add_argument("--dead-steps", choices=("learn", "skip"), default="learn",
                   help="[warmup] dead_steps for every way ranked by plan mean")
    p.add_argument("--ties", type=float, default=0.5,
                   help="ties_within_se of the last way (the by-tag way with near ties to the "
                   "cheaper)")
    return p.parse_args()


class Pool:
    """One structured pool: its agents, each task's parts and oracle, and a run's reward."""

    def __init__(self, seed: int) -> None:
        self.spec = StructuredPoolSpec(seed=seed)
        self.agents = self.spec.agents()
        rows = structured_tasks(self.spec)
        self.oracles: dict[str, Oracle] = {o.id: o for _, o in rows}
        self.parts: dict[str, list[str]] = {
            str(r["id"]): list(r.get("parts") or r["tags"])  # type: ignore[call-overload]
            for r, _ in rows}
        self.tags: dict[str, list[str]] = {
            str(r["id"]): list(r["tags"]) for r, _ in rows}  # type: ignore[call-overload]
        self.rows = {str(r["id"]): r for r, _ in rows}
        with tempfile.TemporaryDirectory() as tmp:  # the sim agents as a pool file loads them
            (Path(tmp) / "pool.toml").write_text(structured_pool_toml(self.spec))
            self.sim_pool = AgentPool.load(Path(tmp) / "pool.toml")

    def sim_right(self, task_id: str, plan: list[PlanStep], sample: int) -> bool:
        """Whether the sim provider's own draws, under `sample`, make the plan's answer right:
        each step answers with the outputs of the steps it sees, as the workflow chains them."""
        row = self.rows[task_id]
        return run_plan(self.sim_pool, plan, row, sample) == row["answer"]

    def value(self, task_id: str, plan: list[PlanStep]) -> tuple[float, float, float]:
        return expected_reward(plan, self.agents, self.parts[task_id], self.spec.wrong,
                               self.spec.cost_penalty_per_usd)

    def run(self, rng: random.Random, task_id: str, plan: list[PlanStep], minute: int,
            fixed: bool = False, sample: int | None = None) -> Trace:
        """One scored run of `plan`, right with its exact probability (or, given a `sample`,
        as the sim's draws under it make it); a conductor's, or a fixed plan's in the
        rehearsal batch."""
        _, p, cost = self.value(task_id, plan)
        right = rng.random() < p if sample is None else self.sim_right(task_id, plan, sample)
        base = 1.0 if right else self.spec.wrong
        reward = max(0.0, base - self.spec.cost_penalty_per_usd * cost)
        trace = scored(task_id, reward, cost=cost, minute=minute, correct=right,
                       conductor="conductor")
        trace.task.tags = self.tags[task_id]
        trace.rounds[0].plan = Plan(steps=[Step(agent=s.agent, subtask="Do it.",
                                                access=list(s.sees)) for s in plan])
        if fixed:
            trace.policy = PolicyRef(name=BASELINE_POLICY, version="base")
            trace.task.batch = BATCH
            trace.rounds[0].attempts[0].prompt = []
        return trace

    def sample(self, rng: random.Random, two_step: float) -> list[PlanStep]:
        names = sorted(self.agents)
        first = PlanStep(agent=rng.choice(names))
        if rng.random() >= two_step:
            return [first]
        return [first, PlanStep(agent=rng.choice(names), sees=[0] if rng.random() < 0.5 else [])]


def steps_of_plan(plan: Plan) -> list[PlanStep]:
    return [PlanStep(agent=s.agent, sees=s.sees(i)) for i, s in enumerate(plan.steps)]


def steps_of(trace: Trace) -> list[PlanStep]:
    plan = trace.rounds[0].plan
    assert plan is not None
    return steps_of_plan(plan)


def one_draw(pool: Pool, args: argparse.Namespace, rng: random.Random, rep: int = 0
             ) -> dict[str, tuple[float, float, float, float, Counter[str], Counter[str], int]]:
    """Per way: (expected, oracle, cost, oracle's cost) summed over the tasks with a selection,
    oracle plans and selections per kind, runs executed."""
    ids = sorted(pool.oracles)
    sim = args.draws != "exact"
    # a sample's own number, as the warm-up's rounds number theirs (workflows/train.py)
    samples = [pool.run(rng, t, pool.sample(rng, args.two_step), k,
                        sample=WARMUP_SAMPLES_FROM + 1000 * rep + k if sim else None)
               for t in ids for k in range(args.samples)]
    cfg = WarmupConfig(enabled=True, rehearse=args.rehearse, rehearse_plans=args.rehearse_plans,
                       more_steps_margin=args.margin, dead_steps=args.dead_steps)
    by_tag = revised(cfg, plan_means_by="tag")
    cheaper = revised(by_tag, ties_within_se=args.ties)

    def number(plan_no: int, r: int) -> int | None:
        """Repeat r's sample: none (exact), the workflow's shared REHEARSAL_SAMPLES_FROM + r
        (sim), or one of the plan's own (sim-fresh)."""
        if not sim:
            return None
        return REHEARSAL_SAMPLES_FROM + r + (1000 * (plan_no + 1) if args.draws == "sim-fresh"
                                             else 0)

    def rehearsal(c: WarmupConfig) -> list[Trace]:
        return [pool.run(rng, t, steps_of_plan(plan), 100 + r, fixed=True,
                         sample=number(plan_no, r))
                for t, plans in candidate_plans(samples, ids, c, BATCH).items()
                for plan_no, plan in enumerate(plans) for r in range(args.rehearse)]

    rehearsed = {WAYS[2]: rehearsal(cfg), WAYS[3]: rehearsal(by_tag)}
    rehearsed[WAYS[4]] = rehearsed[WAYS[3]]  # the same candidates: ties order what is learned
    chosen = {
        WAYS[0]: select_plans(samples, ids, WarmupConfig(rank="run")),
        WAYS[1]: select_plans(samples, ids, WarmupConfig(dead_steps=args.dead_steps)),
        WAYS[2]: select_plans(samples + rehearsed[WAYS[2]], ids, cfg, BATCH),
        WAYS[3]: select_plans(samples + rehearsed[WAYS[3]], ids, by_tag, BATCH),
        WAYS[4]: select_plans(samples + rehearsed[WAYS[3]], ids, cheaper, BATCH),
    }
    out = {}
    for way, selection in chosen.items():
        expected = oracle = cost = oracle_cost = 0.0
        exact: Counter[str] = Counter()
        kinds: Counter[str] = Counter()
        for trace in selection.plans:
            best = pool.oracles[trace.task.id]
            plan = steps_of(trace)
            e, _, c = pool.value(trace.task.id, plan)
            expected += e
            cost += c
            oracle += best.expected_reward
            oracle_cost += pool.value(trace.task.id, best.plan)[2]
            exact[best.kind] += plan == best.plan
            kinds[best.kind] += 1
        runs = len(samples) + len(rehearsed.get(way, []))
        out[way] = (expected, oracle, cost, oracle_cost, exact, kinds, runs)
    return out


def main() -> None:
    args = parse_args()
    started = time.monotonic()
    print(f"{args.samples} samples a task ({args.two_step:.2f} two-step), rehearsal "
          f"{args.rehearse} x {args.rehearse_plans} plans, {args.repeats} draws a pool, "
          f"{args.draws} draws, dead steps {args.dead_steps}")
    totals: dict[str, list[float]] = {w: [0.0] * 5 for w in WAYS}
    for seed in [int(s) for s in args.seeds.split(",")]:
        pool = Pool(seed)
        per: dict[str, list[float]] = {w: [0.0] * 5 for w in WAYS}
        exact: dict[str, Counter[str]] = {w: Counter() for w in WAYS}
        kinds: dict[str, Counter[str]] = {w: Counter() for w in WAYS}
        for rep in range(args.repeats):
            for way, (e, o, c, oc, x, k, runs) in one_draw(pool, args, random.Random(
                    f"{seed}/{rep}"), rep).items():
                for i, v in enumerate((e, o, c, oc, runs / args.repeats)):
                    per[way][i] += v
                exact[way].update(x)
                kinds[way].update(k)
        print(f"\npool seed {seed}:")
        for way in WAYS:
            e, o, c, oc, ran = per[way]
            hits = " · ".join(f"{k} {exact[way][k] / args.repeats:.1f}/"
                              f"{kinds[way][k] / args.repeats:.1f}" for k in sorted(kinds[way]))
            print(f"  {way:<27} expected / oracle {e / o:.3f} · cost / oracle's {c / oc:.2f} "
                  f"· oracle plans per kind: {hits} · {ran:.0f} runs")
            for i, v in enumerate(per[way]):
                totals[way][i] += v
    base = totals[WAYS[0]][0] / totals[WAYS[0]][1]
    print("\nall pools:")
    for way in WAYS:
        e, o, c, oc, ran = totals[way]
        print(f"  {way:<27} expected / oracle {e / o:.3f} ({e / o / base:.3f}x the best run) "
              f"· cost / oracle's {c / oc:.2f} · {ran / totals[WAYS[0]][4]:.1f}x its runs")
    print(f"\n{time.monotonic() - started:.1f}s")


if __name__ == "__main__":
    main()
