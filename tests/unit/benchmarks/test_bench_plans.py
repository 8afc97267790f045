"""bench_plans judges a structured pool written by hand by the oracle computed from its files:
the plan a trace ran, scored exactly under the task's own reward weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from conductor_engine.engine.contracts.traces import Trace
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.providers.sim_structure import PlanStep, pool_oracles, roles_of
from conductor_engine.engine.tasks.files import load_tasks
from tests.benchmarks.bench_plans import Judge
from tests.traces import make_trace

HANDMADE = Path(__file__).resolve().parents[3] / "tests" / "benchmarks" / "pools" / \
    "handmade-structure"


def ran(task_id: str, plan: list[PlanStep], agents: list[str] | None = None) -> Trace:
    """A stored trace of `task_id` whose steps are `plan`'s (or three steps of `agents`)."""
    t = make_trace(task_id)
    base = t.rounds[0].steps
    if agents is not None:
        steps = [s.model_copy(update={"agent": a}) for s, a in zip(base, agents, strict=True)]
    else:
        steps = [s.model_copy(update={"agent": p.agent, "sees": p.sees})
                 for s, p in zip(base, plan, strict=False)]
    return t.model_copy(update={"rounds": [t.rounds[0].model_copy(update={"steps": steps})]})


@pytest.mark.parametrize("pool_file", ["pool.toml", "pool-five.toml"])
def test_a_hand_written_pool_is_judged_by_its_own_oracle(pool_file: str) -> None:
    pool = Pool.load(HANDMADE / pool_file)
    tasks = load_tasks(str(HANDMADE / "tasks.jsonl")).tasks
    oracles = pool_oracles(pool.available(), tasks)
    judge = Judge(roles_of(pool.available()), oracles, tasks)
    for task in tasks:
        best = oracles[task.id]
        plan, value = judge.written(ran(f"heldout~{task.id}", best.plan))
        assert plan == best.plan and value == pytest.approx(best.expected_reward, abs=1e-6)
        # the dear generalist alone is worth less wherever the oracle is a cheap plan
        dear = [PlanStep(agent="tarn")]
        if best.plan != dear:
            assert judge.written(ran(task.id, dear))[1] < best.expected_reward
    task = tasks[0]
    assert judge.written(ran(task.id, [], agents=["tarn", "heron", "lynx"]))[1] == 0.0
    unknown = ran(task.id, [PlanStep(agent="nobody")])
    assert judge.written(unknown) == (None, 0.0)
