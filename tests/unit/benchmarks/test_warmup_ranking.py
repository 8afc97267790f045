"""bench_warmup_ranking's `--draws sim`: runs right or wrong by the sim provider's own draws, so
plans of a task whose final step answers alone share that agent's draws under one sample."""

from __future__ import annotations

from conductor_engine.engine.providers.sim_structure import PlanStep
from tests.benchmarks.bench_warmup_ranking import Pool


def test_plans_ending_in_the_same_agent_alone_share_its_draws_under_one_sample() -> None:
    pool = Pool(1)
    task = next(t for t, o in pool.oracles.items() if o.kind == "review")
    agent = pool.oracles[task].plan[0].agent  # a drafter, right about half the time
    others = [a for a in sorted(pool.agents) if a != agent]
    alone = [PlanStep(agent=agent)]
    apart = [PlanStep(agent=others[0]), PlanStep(agent=agent)]  # its answer, after a wasted call
    draws = [pool.sim_right(task, alone, s) for s in range(1_000_000, 1_000_040)]
    assert draws == [pool.sim_right(task, apart, s) for s in range(1_000_000, 1_000_040)]
    assert 0 < sum(draws) < len(draws)  # the draws differ from sample to sample
    share = sum(pool.sim_right(task, alone, s) for s in range(2_000)) / 2_000
    assert abs(share - pool.value(task, alone)[1]) < 0.05  # at the plan's exact probability
