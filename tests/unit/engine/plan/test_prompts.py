"""The conductor's prompt: a numbered pool, and the plan form it asks for (issue 18)."""

from __future__ import annotations

from conductor_engine.engine.plan.language import parse_plan
from conductor_engine.engine.plan.prompts import conductor_messages, pool_listing
from conductor_engine.engine.providers.pool import AgentSpec, Pool
from tests.paths import ROOT

AGENTS = [
    AgentSpec(id="solver", provider="sim", model="sim", description="Good at maths."),
    AgentSpec(id="checker", provider="sim", model="sim", description="Checks answers."),
    AgentSpec(id="writer", provider="sim", model="sim-writer"),
]


def system_prompt(**kw: object) -> str:
    messages = conductor_messages("What is 6 x 7?", AGENTS, max_steps=3, **kw)  # type: ignore[arg-type]
    return messages[0].content


def test_the_prompt_lists_the_pool_numbered_from_zero() -> None:
    assert pool_listing(AGENTS) == (
        "0. solver: Good at maths.\n1. checker: Checks answers.\n2. writer: sim-writer"
    )
    for json_mode in (True, False):
        assert "0. solver: Good at maths.\n1. checker" in system_prompt(json_mode=json_mode)


def test_a_number_the_conductor_read_in_the_listing_names_that_agent() -> None:
    ids = [a.id for a in AGENTS]  # the order the plan activity passes: the listing's
    text = 'model_id = [2, "0"]\nsubtasks = ["Draft it.", "Check it."]\naccess_list = [[], "all"]'
    assert [s.agent for s in parse_plan(text, ids).steps] == ["writer", "solver"]


def test_the_reasoning_json_prompt_asks_to_reason_first_within_the_bound() -> None:
    prompt = system_prompt(json_mode=True, reasoning_max_chars=1234)
    assert '{"reasoning": "...", "steps": [...]}' in prompt
    assert 'First think in "reasoning"' in prompt and "at most 1234 characters" in prompt
    assert prompt.index('"reasoning"') < prompt.index('"steps"')


def test_the_bare_json_prompt_asks_for_the_steps_alone() -> None:
    prompt = system_prompt(json_mode=True)
    assert 'Reply with {"steps": [...]}, at most 3 steps' in prompt
    assert "reasoning" not in prompt


def test_the_bare_json_prompt_is_the_shortest_form_every_other_says_more() -> None:
    """The bare form is for tiny conductors and its prompt is paid on every plan: it keeps the
    role's point (plan, do not answer; the last step answers) in fewer words than any form."""
    bare = system_prompt(json_mode=True)
    assert bare.startswith("You are the conductor: plan the task")
    assert "the last step's output is the final answer" in bare
    for other in (system_prompt(json_mode=True, reasoning_max_chars=500),
                  system_prompt(json_mode=False)):
        assert len(bare) < len(other) - 250


def test_the_free_text_prompt_asks_to_think_then_write_the_lists_whatever_the_form() -> None:
    for reasoning in (None, 2000):
        prompt = system_prompt(json_mode=False, reasoning_max_chars=reasoning)
        assert prompt.startswith("You are the conductor")
        assert "Think briefly about the task, then end your reply" in prompt
        assert "its id or its number in the pool" in prompt and '"reasoning"' not in prompt


def test_a_conductor_reasons_first_by_default_and_the_sim_rehearsal_plans_bare() -> None:
    spec = AgentSpec(id="c", provider="local", model="m")
    assert spec.plan_form == "reasoning" and spec.reasoning_max_chars == 2000
    # the rehearsal's tiny conductor has 96 tokens: all of them go to the plan
    assert Pool.load(ROOT / "examples" / "sim" / "pool.toml").conductor.plan_form == "bare"
