"""The plan language: both forms, the tolerances the paper's format needs, and every error."""

from __future__ import annotations

import json

import pytest

from conductor_engine.engine.contracts.plans import Plan, Step
from conductor_engine.engine.plan.language import PlanError, parse_plan, plan_json_schema

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


@pytest.mark.parametrize("subtask", ["int-*, \u201c", "say \u2018hi\u2019", "ok</think>"],
                         ids=["curly-double", "curly-single", "think-close"])
def test_a_reply_that_is_one_json_plan_is_read_as_written(subtask: str) -> None:
    """A grammar-constrained conductor's whole reply is the JSON plan, valid as written; the
    free-text clean-up once turned a subtask's “ into " and rejected such a plan (a warm-up
    sample of structured pool 1: `"subtask": "int-*, “"`)."""
    text = json.dumps({"steps": [{"agent": "gpt-5", "subtask": "dissect-", "access": []},
                                 {"agent": "gpt-5", "subtask": subtask, "access": [0]}]},
                      ensure_ascii=False)
    plan = parse_plan(text, POOL)
    assert [s.subtask for s in plan.steps] == ["dissect-", subtask]


def test_curly_quotes_around_a_free_text_plan_are_still_read_as_quotes() -> None:
    text = "Plan:\n{\u201csteps\u201d: [{\u201cagent\u201d: \u201cgpt-5\u201d, " \
           "\u201csubtask\u201d: \u201cSolve.\u201d, \u201caccess\u201d: []}]}"
    assert parse_plan(text, POOL) == Plan(steps=[Step(agent="gpt-5", subtask="Solve.", access=[])])


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


# --- the paper's own forms (issue 18) --------------------------------------------------------

FIGURE_2 = """The first model solves it; the second sees everything and answers.
model_id = ["gpt-5", "claude-sonnet-4"]
subtasks = ["Solve 2^10 vs 10^3.", "Check the work and state which is larger."]
access_list = [[], ["all"]]
"""


def test_the_papers_figure_2_access_list_parses() -> None:
    plan = parse_plan(FIGURE_2, POOL)
    assert plan == parse_plan(PAPER, POOL)
    assert plan.steps[1].access == "all"


@pytest.mark.parametrize(
    "second", ['"all"', '["all"]', "[all]", '[0, "all"]', '["all", 0]', '"ALL"', "['All']"]
)
def test_any_access_entry_naming_all_grants_every_earlier_step(second: str) -> None:
    text = PAPER.replace('[[], "all"]', f"[[], {second}]")
    assert parse_plan(text, POOL).steps[1].access == "all"


@pytest.mark.parametrize(
    ("model", "tasks", "access"),
    [
        ("model ids", "subtasks", "access list"),
        ("model_ids", "sub tasks", "access_lists"),
        ("model id", "sub_tasks", "Access_List"),
        ("Model_ID", "Subtasks", "ACCESS LIST"),
        ("model-id", "subtask", "access-list"),
    ],
)
def test_spaced_or_cased_labels_parse(model: str, tasks: str, access: str) -> None:
    text = (PAPER.replace("model_id =", f"{model} =").replace("subtasks =", f"{tasks} =")
            .replace("access_list =", f"{access} ="))
    assert parse_plan(text, POOL) == parse_plan(PAPER, POOL)


def test_numbered_agents_map_to_ids_in_listing_order() -> None:
    listed = ('model_id = [0, "1", " 3 "]\nsubtasks = ["a", "b", "c"]\n'
              'access_list = [[], [0], "all"]')
    steps = [{"agent": 2, "subtask": "Solve.", "access": []},
             {"agent": "3", "subtask": "Check.", "access": "all"}]
    assert [s.agent for s in parse_plan(listed, POOL).steps] == [
        "gpt-5", "claude-sonnet-4", "conductor"]
    assert [s.agent for s in parse_plan(json.dumps({"steps": steps}), POOL).steps] == [
        "gemini-2.5-pro", "conductor"]


def test_an_id_made_of_digits_is_that_agent_not_a_number() -> None:
    ids = ["7", "x"]
    text = 'model_id = ["7", "1", 0]\nsubtasks = ["a", "b", "c"]\naccess_list = [[], [], []]'
    assert [s.agent for s in parse_plan(text, ids).steps] == ["7", "x", "7"]


def test_an_unknown_agent_lists_the_pool_by_number_and_id() -> None:
    with pytest.raises(PlanError, match=r"by id or number\): 0 gpt-5, 1 claude-sonnet-4"):
        parse_plan('model_id = ["gpt-4"]\nsubtasks = ["a"]\naccess_list = [[]]', POOL)
    with pytest.raises(PlanError, match="agent number 4 is out of range"):
        parse_plan('model_id = ["4"]\nsubtasks = ["a"]\naccess_list = [[]]', POOL)


# --- reasoning first -------------------------------------------------------------------------

STEPS = [{"agent": "gpt-5", "subtask": "Solve it carefully.", "access": []},
         {"agent": "claude-sonnet-4", "subtask": "Check it and answer.", "access": "all"}]


def test_a_reasoning_first_json_object_parses_and_its_reasoning_is_ignored() -> None:
    reply = json.dumps({"reasoning": "gpt-5 solves, claude checks.", "steps": STEPS})
    assert parse_plan(reply, POOL) == parse_plan(json.dumps({"steps": STEPS}), POOL)


@pytest.mark.parametrize(
    "thought",
    [
        'I could write model_id = ["gemini-2.5-pro"], subtasks = ["x"], access_list = [[]]',
        "Maybe model_id = [gemini, then the rest",  # a broken list inside the reasoning
        'Draft: [{"agent": "gemini-2.5-pro", "subtask": "x", "access": []}]',
    ],
    ids=["whole-lists", "broken-list", "json-draft"],
)
def test_plans_written_inside_the_reasoning_are_thoughts_not_the_plan(thought: str) -> None:
    reply = json.dumps({"reasoning": thought, "steps": STEPS})
    assert [s.agent for s in parse_plan(reply, POOL).steps] == ["gpt-5", "claude-sonnet-4"]


def test_the_form_the_reply_ends_with_is_the_plan() -> None:
    json_draft = "Draft: " + json.dumps({"steps": STEPS[:1]}) + "\nFinal:\n"
    assert len(parse_plan(json_draft + PAPER, POOL)) == 2  # the lists come last
    lists_draft = PAPER.replace('"gpt-5", ', "") + "\nNo, as JSON:\n"
    assert len(parse_plan(lists_draft + json.dumps({"steps": STEPS[:1]}), POOL)) == 1
    broken_final = json_draft + 'model_id = ["gpt-5"]\nsubtasks = ["a"]'
    with pytest.raises(PlanError, match="missing access_list"):  # a draft never stands in
        parse_plan(broken_final, POOL)


def test_an_empty_reasoning_first_plan_is_accepted_where_allowed() -> None:
    reply = json.dumps({"reasoning": "The answer is already right.", "steps": []})
    assert len(parse_plan(reply, POOL, allow_empty=True)) == 0


def test_the_reasoning_schema_asks_for_bounded_reasoning_first_then_the_steps() -> None:
    schema = plan_json_schema(POOL, 3, reasoning_max_chars=1500)
    assert list(schema["properties"]) == ["reasoning", "steps"]
    assert schema["properties"]["reasoning"] == {"type": "string", "maxLength": 1500}
    assert schema["required"] == ["reasoning", "steps"]
    assert schema["properties"]["steps"] == plan_json_schema(POOL, 3)["properties"]["steps"]


def test_the_bare_schema_is_the_steps_alone() -> None:
    schema = plan_json_schema(POOL, 3, subtask_max_chars=400)
    assert list(schema["properties"]) == ["steps"] and schema["required"] == ["steps"]
    assert schema["additionalProperties"] is False
    subtask = schema["properties"]["steps"]["prefixItems"][0]["properties"]["subtask"]
    assert subtask == {"type": "string", "minLength": 8, "maxLength": 400}
