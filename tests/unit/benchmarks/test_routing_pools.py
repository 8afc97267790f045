"""The routing pools bench_learning trains on with --pool: each loads, and each of its tags has
exactly one competent agent, read off the agents' sim skills as the bench judges them."""

from __future__ import annotations

from pathlib import Path

import pytest

from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.providers.sim_pool import competent
from conductor_engine.engine.tasks.files import load_tasks
from tests.benchmarks.bench_learning import skill_matrix

ROOT = Path(__file__).resolve().parents[3]
POOLS = [ROOT / "examples" / "sim", ROOT / "tests" / "benchmarks" / "pools" / "handmade",
         ROOT / "tests" / "benchmarks" / "pools" / "handmade-coinflip"]


@pytest.mark.parametrize("folder", POOLS, ids=lambda p: p.name)
def test_every_tag_of_a_routing_pool_has_one_competent_agent(folder: Path) -> None:
    pool = Pool.load(folder / "pool.toml")
    tasks = load_tasks(str(folder / "tasks.jsonl")).tasks
    tags = {t for task in tasks for t in task.tags}
    matrix = skill_matrix(pool, tags)
    experts = {tag: competent(matrix, [tag]) for tag in sorted(tags)}
    assert all(len(agents) == 1 for agents in experts.values()), experts
    assert len({a for agents in experts.values() for a in agents}) == len(tags) == 4
    assert len(tasks) == 24


def test_a_tag_an_agent_does_not_list_gets_its_default_skill() -> None:
    folder = ROOT / "tests" / "benchmarks" / "pools"
    plain = skill_matrix(Pool.load(folder / "handmade" / "pool.toml"), {"music", "food"})
    coin = skill_matrix(Pool.load(folder / "handmade-coinflip" / "pool.toml"), {"music", "food"})
    assert plain["lynx"] == {"food": 0.15, "music": 0.9}
    assert coin["lynx"] == {"food": 0.5, "music": 0.95}
