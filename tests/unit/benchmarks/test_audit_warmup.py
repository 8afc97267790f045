"""tests/benchmarks/audit_warmup.py: the cause it names for each task the warm-up chose badly."""

from __future__ import annotations

import random
from pathlib import Path

from conductor_engine.engine.contracts.plans import Plan, Step
from conductor_engine.engine.contracts.traces import Trace
from conductor_engine.engine.contracts.training import WarmupConfig
from conductor_engine.engine.providers.sim_structure import PlanStep
from tests.benchmarks.audit_warmup import FilePool, audit, phase, steps_label, warmup_round
from tests.benchmarks.bench_warmup_ranking import Pool
from tests.unit.trainer.test_warmup import scored


def runs(pool: Pool, task: str, plan: list[PlanStep], rewards: list[float], name: str
         ) -> list[tuple[str, Trace]]:
    """Stored runs of `plan` on `task` with these rewards, in the training run's phase `name`."""
    out = []
    for k, reward in enumerate(rewards):
        trace = pool.run(random.Random(k), task, plan, minute=k)
        assert trace.reward is not None
        trace.reward.value = reward
        trace.rounds[0].plan = Plan(steps=[Step(agent=s.agent, subtask="Do it.",
                                                access=list(s.sees)) for s in plan])
        out.append((name, trace))
    return out


def test_phases_are_read_off_a_training_runs_workflow_ids() -> None:
    assert phase("train-sim/0a1b/warmup-r2/task-1/3") == "warmup-r2"
    assert phase("batch-eval-x/conductor~task") == "eval"
    assert [warmup_round(p) for p in ["warmup-r0", "rehearse", "rehearse-r3", "it4",
                                      "heldout-v2"]] == [0, 0, 3, None, None]


def test_a_miss_is_named_no_oracle_plan_ran_or_one_lost_on_its_mean() -> None:
    pool = Pool(1)
    task = next(t for t, o in pool.oracles.items() if len(o.plan) == 2)
    best = pool.oracles[task]
    single = [PlanStep(agent=best.plan[0].agent)]  # its draft alone: worth less
    assert pool.value(task, single)[0] < best.expected_reward - 0.05
    cfg = WarmupConfig(enabled=True)
    lucky = runs(pool, task, single, [1.0] * 8, "warmup-r0")
    report = audit(lucky, pool, cfg)
    assert report[0].startswith("round 1: 1 tasks")
    assert report[1].endswith("no oracle plan ran"), report
    # round 2 runs the oracle's plan, unluckily: it ran, and lost on its mean
    oracle = steps_label(best.plan)
    unlucky = runs(pool, task, list(best.plan), [0.0] * 9, "warmup-r1")
    report = audit(lucky + unlucky, pool, cfg)
    assert report[2].startswith("round 2: 1 tasks")
    assert report[3].endswith(f"an oracle plan ran: {oracle}, mean 0.00 over 9"), report
    # round 3: the oracle's plan right 30 times, the draft alone wrong 8: no miss left
    more = [*runs(pool, task, list(best.plan), [1.0] * 30, "warmup-r2"),
            *runs(pool, task, single, [0.0] * 8, "rehearse-r2")]
    report = audit(lucky + unlucky + more, pool, cfg)
    assert report[4] == "round 3: 1 tasks, chosen / oracle 1.000, 0 with a dead step", report


def test_an_oracle_plan_above_the_choice_by_less_than_the_margin_is_named_so() -> None:
    pool = Pool(1)
    task = next(t for t, o in pool.oracles.items() if len(o.plan) == 2)
    best = pool.oracles[task]
    single = [PlanStep(agent=best.plan[0].agent)]
    rows = [*runs(pool, task, single, [1.0] * 9 + [0.0], "warmup-r0"),   # mean 0.90
            *runs(pool, task, list(best.plan), [1.0] * 19 + [0.0], "rehearse")]  # 0.95
    report = audit(rows, pool, WarmupConfig(enabled=True, more_steps_margin=0.1))
    assert report[1].endswith("(above the choice, not by more_steps_margin 0.1)"), report
    assert audit(rows, pool, WarmupConfig(enabled=True))[0].endswith(
        "oracle 1.000, 0 with a dead step")


HAND = Path(__file__).parents[2] / "benchmarks" / "pools" / "handmade-structure"


def test_a_hand_written_pool_is_audited_by_its_own_oracle_and_dead_steps_are_counted() -> None:
    """The five-agent hand pool, read from its files: a plan is worth what the oracle computed
    from the pool's settings says, and a chosen plan whose last step never sees its draft is
    counted in the round's line (the sports kind's "wren, then heron apart")."""
    pool = FilePool(HAND / "pool-five.toml", HAND / "tasks.jsonl")
    task = next(t for t, o in pool.oracles.items() if o.kind == "sports")
    best = pool.oracles[task]
    assert abs(pool.value(task, list(best.plan))[0] - best.expected_reward) < 1e-6
    blind = [PlanStep(agent="wren"), PlanStep(agent=best.plan[0].agent)]
    assert abs(pool.value(task, blind)[1] - best.p_right) < 1e-9  # the draft is never read
    rows = []
    for k in range(4):
        trace = scored(task, 1.0, minute=k)
        trace.task.tags = ["sports"]
        trace.rounds[0].plan = Plan(steps=[Step(agent=s.agent, subtask="Do it.", access=[])
                                           for s in blind])
        rows.append(("warmup-r0", trace))
    report = audit(rows, pool, WarmupConfig(enabled=True))
    assert report[0].endswith(", 1 with a dead step"), report
