"""Generated rehearsal pools (engine/providers/sim_pool.py) and the held-out split
(engine/contracts/training.py split_heldout)."""

from __future__ import annotations

import json
import tomllib
from collections import Counter
from pathlib import Path

import pytest

from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.contracts.training import split_heldout
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.providers.sim_pool import (
    TAGS,
    SimPoolSpec,
    competent,
    pool_toml,
    tasks,
)
from conductor_engine.engine.tasks.files import load_tasks


def write(spec: SimPoolSpec, tmp_path: Path) -> tuple[Pool, list[Task]]:
    (tmp_path / "pool.toml").write_text(pool_toml(spec))
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in tasks(spec)))
    return Pool.load(tmp_path / "pool.toml"), load_tasks(str(tmp_path / "tasks.jsonl")).tasks


def test_a_generated_pool_loads_and_every_tag_has_exactly_one_competent_agent(
        tmp_path: Path) -> None:
    spec = SimPoolSpec(agents=4, tags=4, seed=7, tasks_per_tag=6)
    pool, loaded = write(spec, tmp_path)
    assert [a.id for a in pool.agents] == spec.agent_names()
    assert len({a.description for a in pool.agents}) == 1, "descriptions give nothing away"
    assert pool.conductor.plan_form == "bare"
    matrix = spec.skill_matrix()
    tags = spec.tag_names()
    assert Counter(t.tags[0] for t in loaded) == dict.fromkeys(tags, 6)
    experts = [competent(matrix, [t]) for t in tags]
    assert all(len(e) == 1 for e in experts)
    assert len(set().union(*experts)) == 4, "four agents, four tags: one specialist each"
    for agent in pool.agents:  # the pool file carries the matrix the generator meant
        assert agent.sim is not None
        assert {t: agent.sim.skill([t]) for t in tags} == matrix[agent.id]
    assert len({t.id for t in loaded}) == len(loaded) and len({t.question for t in loaded}) \
        == len(loaded)


def test_the_same_seed_writes_the_same_files_and_other_seeds_other_pools(tmp_path: Path) -> None:
    a, b, c = SimPoolSpec(seed=1), SimPoolSpec(seed=1), SimPoolSpec(seed=2)
    assert pool_toml(a) == pool_toml(b) and tasks(a) == tasks(b)
    assert (a.tag_names(), a.agent_names()) != (c.tag_names(), c.agent_names())
    assert {tuple(SimPoolSpec(seed=s).tag_names()) for s in range(12)}.__len__() > 3


def test_a_random_skill_matrix_still_has_a_best_agent_per_tag_at_the_high_skill() -> None:
    spec = SimPoolSpec(agents=5, tags=len(TAGS), seed=3, skills="random")
    matrix = spec.skill_matrix()
    for tag in spec.tag_names():
        assert max(row[tag] for row in matrix.values()) == spec.high
        assert all(spec.low <= row[tag] <= spec.high for row in matrix.values())
    tomllib.loads(pool_toml(spec))


def test_more_tasks_per_tag_than_the_bank_holds_is_refused() -> None:
    with pytest.raises(ValueError):
        SimPoolSpec(tasks_per_tag=1000)


def test_the_held_out_split_is_stratified_deterministic_and_disjoint(tmp_path: Path) -> None:
    _, loaded = write(SimPoolSpec(seed=5, tasks_per_tag=8), tmp_path)
    train, held = split_heldout(loaded, 0.25, seed=0)
    assert len(held) == 8 and len(train) == 24
    assert Counter(t.tags[0] for t in held) == Counter({t: 2 for t in {x.tags[0] for x in loaded}})
    assert not {t.id for t in train} & {t.id for t in held}
    again_train, again_held = split_heldout(list(reversed(loaded)), 0.25, seed=0)
    assert {t.id for t in again_held} == {t.id for t in held}, "order does not change the split"
    _, other = split_heldout(loaded, 0.25, seed=1)
    assert {t.id for t in other} != {t.id for t in held}
    assert split_heldout(loaded, 0.0) == (loaded, [])
    # a tag with one task is never held out whole: it must be trained on too
    lone = [Task(id="x", question="q", tags=["solo"])]
    assert split_heldout(lone, 0.5) == (lone, [])


def test_conductor_sim_pool_writes_a_pool_and_tasks_that_load(tmp_path: Path) -> None:
    from tests.cli import run_conductor

    out = tmp_path / "pool-3"
    proc = run_conductor("sim", "pool", "--agents", "4", "--tags", "4", "--seed", "3",
                         "--tasks-per-tag", "6", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    pool = Pool.load(out / "pool.toml")
    assert len(pool.agents) == 4 and len(load_tasks(str(out / "tasks.jsonl")).tasks) == 24
    assert (out / "pool.toml").read_text() == pool_toml(SimPoolSpec(seed=3, tasks_per_tag=6))
    assert "competent at" in proc.stdout
    bad = run_conductor("sim", "pool", "--skills", "some", "--out", str(tmp_path / "x"))
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("error:")


def test_training_order_deals_the_tags_in_turn_keeps_every_task_and_repeats(
        tmp_path: Path) -> None:
    from conductor_engine.engine.contracts.training import interleave_tags

    _, loaded = write(SimPoolSpec(seed=4, tasks_per_tag=5), tmp_path)
    bunched = sorted(loaded, key=lambda t: t.tags[0])  # a plain file, one kind after another
    order = interleave_tags(bunched, seed=3)
    assert sorted(t.id for t in order) == sorted(t.id for t in loaded)
    for k in range(0, len(order), 4):  # every window of 4 holds each of the 4 tags once
        assert len({t.tags[0] for t in order[k:k + 4]}) == 4
    assert [t.id for t in interleave_tags(list(reversed(bunched)), seed=3)] == \
        [t.id for t in order], "the order depends on the seed and ids, not the file's order"
    assert [t.id for t in interleave_tags(bunched, seed=4)] != [t.id for t in order]
