"""The plan language: both forms, the tolerances the paper's format needs, and every error."""

from __future__ import annotations

import json

import pytest

from conductor_engine.engine.plan.language import (
    Plan,
    PlanError,
    Step,
    parse_plan,
    plan_json_schema,
)

POOL = ["gpt-5", "claude-sonnet-4", "gemini-2.5-pro", "conductor"]

PAPER = """I will split this into solving and checking.
model_id = ["gpt-5", "claude-sonnet-4"]
subtasks = ["Solve 2^10 vs 10^3.", "Check the work and state which is larger."]
access_list = [[], "all"]
"""


def test_paper_form_parses_into_steps_with_access_lists() -> None:
    plan = parse_plan(PAPER, POOL)
    assert [s.agent for s in plan.steps] == ["gpt-5", "claude-sonnet-4"]
    assert plan.steps[0].access == [] and plan.steps[1].access == "all"
    assert plan.steps[1].sees(1) == [0]


@pytest.mark.parametrize(
    "text",
    [
        "```python\n" + PAPER + "```",
        "<think>maybe model_id = ['x']</think>\n" + PAPER,
        "reasoning...</think>" + PAPER,  # opening tag eaten by the chat template
        PAPER.replace(" = ", ": "),
        PAPER.replace('"', "'"),
        PAPER.replace('"gpt-5"', "\u201cgpt-5\u201d").replace("[[]", "[[]"),
        PAPER.replace('"all"', "all"),
    ],
    ids=["fence", "think", "half-think", "colon", "single-quotes", "smart-quotes", "bare-all"],
)
def test_paper_form_tolerates_common_variations(text: str) -> None:
    assert parse_plan(text, POOL) == parse_plan(PAPER, POOL)


def test_later_lists_win_over_drafts_in_the_reasoning() -> None:
    text = "Draft: model_id = ['gemini-2.5-pro']\nFinal:\n" + PAPER
    assert parse_plan(text, POOL).steps[0].agent == "gpt-5"


def test_json_form_as_object_or_bare_list() -> None:
    steps = [{"agent": "gpt-5", "subtask": "Solve.", "access": []},
             {"agent": "conductor", "subtask": "Check.", "access": [0]}]
    a = parse_plan(json.dumps({"steps": steps}), POOL)
    b = parse_plan("Here is the plan:\n```json\n" + json.dumps(steps) + "\n```", POOL)
    assert a == b == Plan(steps=[Step(agent="gpt-5", subtask="Solve.", access=[]),
                                 Step(agent="conductor", subtask="Check.", access=[0])])


def test_a_raw_control_character_in_a_subtask_does_not_invalidate_the_plan() -> None:
    """xgrammar's JSON strings admit raw control characters, which strict JSON refuses."""
    text = '{"steps": [{"agent": "gpt-5", "subtask": "Solve\tit\x17", "access": []}]}'
    assert parse_plan(text, POOL).steps[0].subtask == "Solve\tit\x17"


def test_integer_agents_are_positions_in_the_pool_listing() -> None:
    text = 'model_id = [0, 3]\nsubtasks = ["a", "b"]\naccess_list = [[], [0]]'
    assert [s.agent for s in parse_plan(text, POOL).steps] == ["gpt-5", "conductor"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("I think the answer is 42.", "no plan found"),
        ('model_id = ["gpt-5"]\nsubtasks = ["a"]', "missing access_list"),
        ('model_id = ["gpt-5", "gpt-5"]\nsubtasks = ["a"]\naccess_list = [[], []]',
         "model_id has 2 entries, subtasks has 1"),
        ('model_id = ["gpt-4"]\nsubtasks = ["a"]\naccess_list = [[]]', "unknown agent 'gpt-4'"),
        ('model_id = [9]\nsubtasks = ["a"]\naccess_list = [[]]', "agent number 9 is out of range"),
        ('model_id = ["gpt-5"]\nsubtasks = [""]\naccess_list = [[]]', "subtask must be"),
        ('model_id = ["gpt-5"]\nsubtasks = ["a"]\naccess_list = [[0]]', "not earlier steps"),
        ('model_id = ["gpt-5", "gpt-5"]\nsubtasks = ["a", "b"]\naccess_list = [[], [1]]',
         "not earlier steps"),
        ('model_id = ["gpt-5"]\nsubtasks = ["a"]\naccess_list = ["some"]', 'access must be "all"'),
        ("model_id = []\nsubtasks = []\naccess_list = []", "no steps"),
        ('model_id = ["gpt-5"\nsubtasks = ["a"]', "never closed"),
        ('model_id = [gpt-5]\nsubtasks = ["a"]\naccess_list = [[]]', "not a valid Python list"),
    ],
)
def test_invalid_plans_say_exactly_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(PlanError, match=message.replace("(", r"\(").replace("[", r"\[")):
        parse_plan(text, POOL)


def test_too_many_steps_is_rejected_with_the_limit() -> None:
    n = 6
    text = (f"model_id = {['gpt-5'] * n}\nsubtasks = {['x'] * n}\naccess_list = {[[]] * n}")
    with pytest.raises(PlanError, match="6 steps; at most 5"):
        parse_plan(text, POOL)
    assert len(parse_plan(text, POOL, max_steps=6)) == 6


def test_empty_plan_is_accepted_only_where_allowed() -> None:
    text = "model_id = []\nsubtasks = []\naccess_list = []"
    assert len(parse_plan(text, POOL, allow_empty=True)) == 0


def test_json_schema_enumerates_agents_and_bounds_steps() -> None:
    schema = plan_json_schema(POOL, 3)
    steps = schema["properties"]["steps"]
    assert steps["maxItems"] == 3 and steps["minItems"] == 1
    first, third = steps["prefixItems"][0], steps["prefixItems"][2]
    assert first["properties"]["agent"]["enum"] == sorted(POOL)
    assert first["properties"]["access"]["anyOf"][1]["maxItems"] == 0  # step 0 reads nothing
    assert third["properties"]["access"]["anyOf"][1]["items"]["maximum"] == 1
