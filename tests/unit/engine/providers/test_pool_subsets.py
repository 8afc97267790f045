"""Randomised pools and self-call context, without a server: a task's own `agents`, training's
per-group or per-rollout subsets of the pool (engine/contracts/training.py `group_agents`),
and the prompts a self-call's sub-plan and its agents get."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pydantic import ValidationError

from conductor_engine.activities.plan import task_agents
from conductor_engine.engine.contracts.tasks import SeenStep, Task
from conductor_engine.engine.contracts.training import RolloutConfig, group_agents
from conductor_engine.engine.plan.language import PlanError, parse_plan
from conductor_engine.engine.plan.prompts import agent_messages, conductor_messages
from conductor_engine.engine.providers.pool import Pool, PoolError
from conductor_engine.engine.tasks.files import load_jsonl
from tests.plans import plan_json

POOL = [f"agent-{c}" for c in "abcdefg"]
PINNED = ["agent-e", "agent-g"]
"""group_agents(POOL, min 2, max 4, shuffled; seed 0, "run", iteration 0, "t0"), as drawn when
it was written: the draw must never change under a running training."""


def pool() -> Pool:
    def sim(i: str) -> dict[str, str]:
        return {"id": i, "provider": "sim", "model": i, "description": f"the {i} model"}

    return Pool.model_validate({
        "conductor": {"id": "conductor", "provider": "openai-compatible", "model": "c",
                      "base_url": "http://127.0.0.1:9/v1"},
        "agents": [sim("gpt"), sim("claude"), sim("gemini"),
                   {"id": "keyed", "provider": "openai", "model": "k",
                    "api_key_env": "POOL_TEST_UNSET_KEY"}],
    })


def draw(cfg: RolloutConfig, task_id: str = "t1", iteration: int = 0, seed: int = 0,
         name: str = "run") -> list[str] | None:
    return group_agents(POOL, cfg, seed=seed, name=name, iteration=iteration, task_id=task_id)


# --- a task's own agents ------------------------------------------------------------------


def test_a_task_with_agents_shows_the_conductor_only_those_in_its_order() -> None:
    agents = task_agents(pool(), ["gemini", "gpt"])
    assert [a.id for a in agents] == ["gemini", "gpt"]
    system = conductor_messages("q", agents, max_steps=3, json_mode=False)[0].content
    assert "gemini" in system and "gpt" in system
    assert "claude" not in system and "conductor" not in system.split("The pool")[1][:200]
    assert system.index("the gemini model") < system.index("the gpt model")


def test_a_task_without_agents_gets_the_whole_available_pool() -> None:
    assert [a.id for a in task_agents(pool(), None)] == ["gpt", "claude", "gemini", "conductor"]


def test_a_plan_naming_an_agent_outside_the_tasks_agents_is_invalid() -> None:
    ids = [a.id for a in task_agents(pool(), ["gemini", "gpt"])]
    with pytest.raises(PlanError, match="claude"):
        parse_plan(plan_json(("claude", "Answer.", [])), ids, max_steps=3)
    assert parse_plan(plan_json(("gemini", "Answer.", [])), ids, max_steps=3).steps


@pytest.mark.parametrize(("agents", "message"), [
    (["gpt", "mistral"], "name 'mistral', which this worker's pool does not have; this "
                         "worker offers: gpt, claude, gemini, conductor"),
    (["keyed"], "has but cannot call (set POOL_TEST_UNSET_KEY)"),
])
def test_an_agent_the_worker_cannot_offer_is_one_clear_line(
    agents: list[str], message: str
) -> None:
    with pytest.raises(PoolError) as info:
        task_agents(pool(), agents)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_the_conductor_not_offered_as_an_agent_is_said_so() -> None:
    p = pool().model_copy(update={"offer_conductor_as_agent": False})
    with pytest.raises(PoolError, match="offer_conductor_as_agent = false"):
        task_agents(p, ["conductor"])


def test_task_agents_must_be_distinct_and_not_empty() -> None:
    with pytest.raises(ValidationError, match="repeated: gpt"):
        Task(question="q", agents=["gpt", "claude", "gpt"])
    with pytest.raises(ValidationError):
        Task(question="q", agents=[])
    assert Task.model_validate({"question": "q"}).agents is None  # old inputs decode


def test_a_task_file_line_may_name_its_agents(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text('{"id": "a", "question": "q", "agents": ["gemini", "gpt"]}\n'
                 '{"id": "b", "question": "q", "agents": ["gpt", "gpt"]}\n'
                 '{"id": "c", "question": "q", "agents": "gpt"}\n'
                 '{"id": "d", "question": "q"}\n')
    loaded = load_jsonl(f)
    assert [(t.id, t.agents) for t in loaded.tasks] == [("a", ["gemini", "gpt"]), ("d", None)]
    assert [e.line for e in loaded.errors] == [2, 3]
    assert "repeated: gpt" in loaded.errors[0].message
    assert "field agents" in loaded.errors[1].message


# --- training's subsets -------------------------------------------------------------------


def test_no_recipe_for_the_pool_keeps_the_whole_pool() -> None:
    assert draw(RolloutConfig()) is None


def test_a_groups_subset_is_within_bounds_in_pool_order_and_varies_by_group() -> None:
    cfg = RolloutConfig(pool_subset_min=2, pool_subset_max=4)
    subsets = [draw(cfg, task_id=f"t{i}", iteration=it) for i in range(40) for it in range(3)]
    for s in subsets:
        assert s is not None and 2 <= len(s) <= 4
        assert s == [a for a in POOL if a in s], "pool order without shuffle_pool"
    assert {len(s or []) for s in subsets} == {2, 3, 4}, "every size in the bounds is drawn"
    assert len({tuple(s or []) for s in subsets}) > 20, "groups draw apart"
    counts = Counter(a for s in subsets for a in s or [])
    assert set(counts) == set(POOL), "every agent is drawn sometimes"


def test_the_draw_is_the_same_on_every_replay_and_rerun() -> None:
    cfg = RolloutConfig(pool_subset_min=1, pool_subset_max=3, shuffle_pool=True)
    first = [draw(cfg, task_id=f"t{i}") for i in range(10)]
    assert first == [draw(cfg, task_id=f"t{i}") for i in range(10)]
    # what the draw depends on: the recipe seed and the training name too
    assert first != [draw(cfg, task_id=f"t{i}", seed=1) for i in range(10)]
    assert first != [draw(cfg, task_id=f"t{i}", name="other") for i in range(10)]
    # pinned: a change of the draw would change the agents a resumed run's groups see
    assert draw(RolloutConfig(pool_subset_min=2, pool_subset_max=4, shuffle_pool=True),
                task_id="t0") == PINNED


def test_shuffle_pool_alone_keeps_every_agent_in_a_random_order_per_group() -> None:
    cfg = RolloutConfig(shuffle_pool=True)
    orders = [draw(cfg, task_id=f"t{i}") for i in range(30)]
    assert all(sorted(o or []) == sorted(POOL) for o in orders)
    assert len({(o or [""])[0] for o in orders}) > 3, "no agent is always shown first"


def test_per_rollout_each_run_of_a_group_draws_its_own_and_group_mode_shares_one() -> None:
    def runs(per: str, task_id: str) -> list[list[str] | None]:
        cfg = RolloutConfig(pool_subset_min=2, pool_subset_max=4, shuffle_pool=True,
                            vary_pool_per=per)  # type: ignore[arg-type]
        return [group_agents(POOL, cfg, seed=0, name="run", iteration=0, task_id=task_id,
                             sample=s) for s in range(8)]

    assert runs("group", "t0") == [PINNED] * 8, "one draw per group, the pinned one"
    per_run = [runs("rollout", f"t{i}") for i in range(10)]
    assert all(len({tuple(r or []) for r in group}) > 3 for group in per_run), \
        "a group's runs see different subsets and orders"
    assert per_run == [runs("rollout", f"t{i}") for i in range(10)], "the same on a replay"
    firsts = Counter((r or [""])[0] for group in per_run for r in group)
    assert set(firsts) == set(POOL), "every agent is sometimes shown first"


def test_bounds_clamp_to_the_pool_and_min_over_max_is_refused() -> None:
    assert draw(RolloutConfig(pool_subset_min=10)) == POOL
    assert len(draw(RolloutConfig(pool_subset_max=1)) or []) == 1
    with pytest.raises(ValidationError, match="greater than pool_subset_max"):
        RolloutConfig(pool_subset_min=3, pool_subset_max=2)


# --- self-call context --------------------------------------------------------------------

BACKGROUND = [SeenStep(index=0, agent="gpt", subtask="Recall.", output="NOTE: ^ is power")]


def test_a_self_call_childs_conductor_prompt_holds_the_job_the_part_and_the_background() -> None:
    agents = task_agents(pool(), None)
    user = conductor_messages("Find the two numbers.", agents, max_steps=3, json_mode=False,
                              context=BACKGROUND,
                              outer_question="Which is larger, 2^10 or 10^3?")[1].content
    job = user.index("Which is larger, 2^10 or 10^3?")
    assert job < user.index("NOTE: ^ is power") < user.index("Task:\nFind the two numbers.")
    plain = conductor_messages("q", agents, max_steps=3, json_mode=False)[1].content
    assert plain == "Task:\nq", "a user's task reads as before"


def test_a_self_call_childs_agent_sees_the_job_its_part_and_granted_background() -> None:
    text = agent_messages("Find the two numbers.", "Compute 2^10.", [],
                          outer_question="Which is larger, 2^10 or 10^3?",
                          background=BACKGROUND)[0].content
    assert "working on this job:\nWhich is larger, 2^10 or 10^3?" in text
    assert "current part of the job:\nFind the two numbers." in text
    assert "NOTE: ^ is power" in text and text.endswith("Answer the subtask directly and "
                                                        "completely.")
    assert agent_messages("q", "s", [])[0].content.startswith(
        "You are one member of a team working on this task:\nq")
