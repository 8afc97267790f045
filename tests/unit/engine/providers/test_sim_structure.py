"""Structured rehearsal pools (engine/providers/sim_structure.py): the oracle's arithmetic, its
agreement with the sim agents' own draws, and the files `conductor sim pool --structure` writes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from conductor_engine.engine.contracts.agent_calls import TaskInfo
from conductor_engine.engine.contracts.rewards import RewardWeights
from conductor_engine.engine.providers import sim
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.providers.sim_structure import (
    AgentRole,
    PlanStep,
    StructuredPoolSpec,
    expected_reward,
    p_right,
    plans,
    pool_oracles,
    roles_of,
    structured_pool_toml,
    structured_tasks,
    task_parts,
)
from conductor_engine.engine.rewards import score_run
from conductor_engine.engine.tasks.files import load_tasks


def role(skills: dict[str, float], review: dict[str, float] | None = None) -> AgentRole:
    return AgentRole(skills=skills, review=review or {}, default_skill=0.0, output_tokens=100,
                     price_output_per_mtok=10.0)


def chain(a: str, b: str) -> list[PlanStep]:
    return [PlanStep(agent=a), PlanStep(agent=b, sees=[0])]


def test_the_oracle_probabilities_follow_the_sim_rules_in_closed_form() -> None:
    agents = {"a": role({"x": 0.6, "y": 0.2}, {"y": 0.9}),
              "b": role({"x": 0.5, "y": 0.9}, {"x": 0.8})}
    assert p_right([PlanStep(agent="a")], agents, ["x"]) == pytest.approx(0.6)
    # draft + review: the draft kept (sA rB), else the reviewer's own answer
    assert p_right(chain("a", "b"), agents, ["x"]) == pytest.approx(0.6 * 0.8 + 0.5 * (1 - 0.48))
    assert p_right([PlanStep(agent="a"), PlanStep(agent="b")], agents, ["x"]) == \
        pytest.approx(0.5), "a last step that sees nothing answers alone"
    assert p_right(chain("a", "a"), agents, ["x"]) == pytest.approx(0.6), \
        "the same agent twice draws the same answer"
    # a split: every part must be right at the final step
    px = 0.6 * 0.8 + 0.5 * (1 - 0.48)
    assert p_right(chain("a", "b"), agents, ["x", "y"]) == pytest.approx(px * (0.2 * 0.0 + 0.9))
    value, p, cost = expected_reward(chain("a", "b"), agents, ["x"], wrong=0.25, penalty=5.0)
    assert cost == pytest.approx(0.002) and p == pytest.approx(px)
    assert value == pytest.approx(p * (1 - 0.01) + (1 - p) * (0.25 - 0.01))


def test_the_expected_reward_charges_cost_as_the_scorer_does() -> None:
    agents = {"a": role({"x": 1.0})}
    value, _, cost = expected_reward([PlanStep(agent="a")], agents, ["x"], wrong=0.25,
                                     penalty=5.0)
    weights = RewardWeights(wrong=0.25, cost_penalty_per_usd=5.0)
    scored = score_run("completed", "r", "r", "exact", cost_usd=cost, weights=weights).value
    assert value == pytest.approx(scored)


def run_plan(pool: Pool, plan: list[PlanStep], row: dict[str, object], sample: int) -> str:
    """The final answer of a plan, as the workflow would chain the sim agents' calls."""
    outputs: list[str] = []
    for step in plan:
        spec = pool.get(step.agent)
        assert spec.sim is not None
        outputs.append(sim.answer(spec, spec.sim, TaskInfo(
            task_id=str(row["id"]), tags=list(row["tags"]),  # type: ignore[call-overload]
            reference=str(row["answer"]), verifier="exact", sample=sample,
            parts=list(row.get("parts", [])),  # type: ignore[call-overload]
            seen=[outputs[j] for j in step.sees])))
    return outputs[-1]


def test_the_oracle_matches_the_share_the_sim_agents_get_right(tmp_path: Path) -> None:
    spec = StructuredPoolSpec(seed=4, tasks_per_kind=1)
    (tmp_path / "pool.toml").write_text(structured_pool_toml(spec))
    pool = Pool.load(tmp_path / "pool.toml")
    agents = spec.agents()
    for row, best in structured_tasks(spec):
        parts = list(row.get("parts") or row["tags"])  # type: ignore[call-overload]
        for plan in [best.plan, *plans(sorted(agents))[::7]]:
            n = 800
            share = sum(run_plan(pool, plan, row, s) == row["answer"] for s in range(n)) / n
            assert share == pytest.approx(p_right(plan, agents, parts), abs=0.05), (row, plan)


HANDMADE = Path(__file__).resolve().parents[4] / "tests" / "benchmarks" / "pools" / \
    "handmade-structure"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_oracle_read_off_a_pool_file_is_the_generators_own(tmp_path: Path, seed: int) -> None:
    spec = StructuredPoolSpec(seed=seed)
    (tmp_path / "pool.toml").write_text(structured_pool_toml(spec))
    rows = structured_tasks(spec)
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r, _ in rows))
    read = pool_oracles(Pool.load(tmp_path / "pool.toml").available(),
                        load_tasks(str(tmp_path / "tasks.jsonl")).tasks)
    for _, best in rows:
        mine = read[best.id]
        assert (mine.plan, mine.shape, mine.expected_reward, mine.p_right, mine.cost_usd) == (
            best.plan, best.shape, best.expected_reward, best.p_right, best.cost_usd)


@pytest.mark.parametrize(("pool_file", "expected"), [
    ("pool.toml", {"sports": (["lynx"], "1 step"), "music": (["heron"], "1 step"),
                   "sports+music": (["heron", "lynx"], "split"),
                   "literature": (["lynx", "sable"], "draft + review"),
                   "physics": (["tarn"], "1 step")}),
    ("pool-five.toml", {"sports": (["heron"], "1 step"), "music": (["sable"], "1 step"),
                        "sports+music": (["heron", "sable"], "split"),
                        "literature": (["wren", "lynx"], "draft + review"),
                        "physics": (["tarn"], "1 step")}),
])
def test_the_hand_written_structured_pools_need_every_shape_and_the_sim_agrees(
        pool_file: str, expected: dict[str, tuple[list[str], str]]) -> None:
    pool = Pool.load(HANDMADE / pool_file)
    tasks = load_tasks(str(HANDMADE / "tasks.jsonl")).tasks
    oracles = pool_oracles(pool.available(), tasks)
    by_kind = {o.kind: ([s.agent for s in o.plan], o.shape) for o in oracles.values()}
    assert by_kind == expected  # what each pool file's header says the conductor must find
    roles = roles_of(pool.available())
    seen: set[str] = set()
    for t in tasks:  # the oracle's probabilities are the sim's, on one task of each kind
        if oracles[t.id].kind in seen:
            continue
        seen.add(oracles[t.id].kind)
        row = {"id": t.id, "tags": t.tags, "answer": t.reference, "parts": t.parts}
        for plan in [oracles[t.id].plan, *plans(sorted(roles))[::9]]:
            n = 800
            share = sum(run_plan(pool, plan, row, s) == t.reference for s in range(n)) / n
            assert share == pytest.approx(p_right(plan, roles, task_parts(t)), abs=0.05)


def test_a_pool_the_oracle_cannot_score_exactly_is_refused_with_what_to_change() -> None:
    pool = Pool.load(HANDMADE / "pool.toml")
    task = load_tasks(str(HANDMADE / "tasks.jsonl")).tasks[0]
    priced = [a.model_copy(update={"price_input_per_mtok": 1.0}) for a in pool.available()]
    with pytest.raises(ValueError, match="price_input_per_mtok = 0"):
        roles_of(priced)
    with pytest.raises(ValueError, match="one tag per task"):
        task_parts(task.model_copy(update={"tags": ["sports", "music"]}))


def test_the_oracle_plan_of_each_kind_has_the_shape_the_kind_is_for() -> None:
    for seed in (1, 2, 3):
        spec = StructuredPoolSpec(seed=seed)
        roles = spec.roles()
        shapes = {o.kind: (o.shape, [s.agent for s in o.plan])
                  for _, o in structured_tasks(spec)}
        assert shapes["one"][0] == "1 step" and shapes["one"][1][0] in (roles["A"], roles["B"])
        assert shapes["review"][0] == "draft + review"
        assert set(shapes["review"][1]) == {roles["A"], roles["R"]}
        assert shapes["split"] == ("split", [roles["A"], roles["B"]]) or \
            shapes["split"] == ("split", [roles["B"], roles["A"]])
        assert shapes["generalist"] == ("1 step", [roles["generalist"]])


def test_routing_alone_cannot_reach_nine_tenths_of_the_oracle() -> None:
    """The pools are built so a conductor must learn plans, not only whom to ask: the best
    single agent per task falls short of the 0.9 bar."""
    spec = StructuredPoolSpec(seed=1)
    agents = spec.agents()
    oracle = routed = 0.0
    for row, best in structured_tasks(spec):
        parts = list(row.get("parts") or row["tags"])  # type: ignore[call-overload]
        oracle += best.expected_reward
        routed += max(expected_reward([PlanStep(agent=a)], agents, parts, spec.wrong,
                                      spec.cost_penalty_per_usd)[0] for a in agents)
    assert routed / oracle < 0.86


def test_conductor_sim_pool_structure_writes_pool_tasks_and_oracle(tmp_path: Path) -> None:
    from tests.cli import run_conductor

    out = tmp_path / "s5"
    proc = run_conductor("sim", "pool", "--structure", "--seed", "5", "--tasks-per-tag", "4",
                         "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    spec = StructuredPoolSpec(seed=5, tasks_per_kind=4)
    assert (out / "pool.toml").read_text() == structured_pool_toml(spec)
    pool = Pool.load(out / "pool.toml")
    assert len(pool.agents) == 4 and len({a.description for a in pool.agents}) == 1
    loaded = load_tasks(str(out / "tasks.jsonl")).tasks
    oracle = [json.loads(line) for line in (out / "oracle.jsonl").read_text().splitlines()]
    assert [t.id for t in loaded] == [o["id"] for o in oracle] and len(loaded) == 16
    assert Counter(o["kind"] for o in oracle) == {"one": 4, "review": 4, "split": 4,
                                                 "generalist": 4}
    split = next(t for t in loaded if t.parts)
    assert len(split.parts) == 2 and split.reference is not None
    assert split.options.max_steps == 2 and split.options.reward.cost_penalty_per_usd > 0
    assert "draft + review" in proc.stdout and "split" in proc.stdout
    bad = run_conductor("sim", "pool", "--structure", "--tasks-per-tag", "9",
                        "--out", str(tmp_path / "x"))
    assert bad.returncode == 2 and "at most 8" in bad.stderr


def test_an_agents_default_review_counts_in_the_oracle_read_off_its_file() -> None:
    pool = Pool.load(HANDMADE / "pool.toml")
    sable = pool.get("sable")
    assert sable.sim is not None
    kind = sable.model_copy(update={"sim": sable.sim.model_copy(update={"default_review": 0.8})})
    pool = pool.model_copy(update={"agents": [kind if a.id == "sable" else a
                                              for a in pool.agents]})
    roles = roles_of(pool.available())
    task = next(t for t in load_tasks(str(HANDMADE / "tasks.jsonl")).tasks if t.tags == ["music"])
    plan = [PlanStep(agent="heron"), PlanStep(agent="sable", sees=[0])]  # sable keeps music now
    assert p_right(plan, roles, task_parts(task)) > 0.75  # heron's 0.9 kept at 0.8, or sable's own
    row = {"id": task.id, "tags": task.tags, "answer": task.reference, "parts": task.parts}
    share = sum(run_plan(pool, plan, row, s) == task.reference for s in range(800)) / 800
    assert share == pytest.approx(p_right(plan, roles, task_parts(task)), abs=0.05)
