"""Sim agents where context matters (engine/providers/sim.py): a reviewer keeps an earlier right
answer at its review rate, and a composite task is right only when every part is."""

from __future__ import annotations

from typing import Any

import pytest

from conductor_engine.engine.contracts.agent_calls import TaskInfo
from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.providers import sim
from conductor_engine.engine.providers.pool import AgentSpec, SimSettings
from conductor_engine.engine.rewards import score_run

SAMPLES = 4000


def agent(agent_id: str, **settings: Any) -> AgentSpec:
    return AgentSpec(id=agent_id, provider="sim", model="sim", sim=SimSettings(**settings))


def answer(spec: AgentSpec, task: TaskInfo) -> str:
    assert spec.sim is not None
    return sim.answer(spec, spec.sim, task)


def single(sample: int, seen: list[str] | None = None) -> TaskInfo:
    return TaskInfo(task_id="t", tags=["geo"], reference="Paris", verifier="exact",
                    sample=sample, seen=seen or [])


def composite(sample: int, seen: list[str] | None = None) -> TaskInfo:
    return TaskInfo(task_id="c", tags=["geo+chem"], reference="Paris; Au", verifier="exact",
                    sample=sample, parts=["geo", "chem"], seen=seen or [])


def test_review_and_part_draws_repeat_exactly() -> None:
    reviewer = agent("r", skills={"geo": 0.5, "chem": 0.5}, review={"geo": 0.5, "chem": 0.5})
    for task in (single, composite):
        first = [answer(reviewer, task(s, ["Paris", "Paris; Au"])) for s in range(200)]
        assert first == [answer(reviewer, task(s, ["Paris", "Paris; Au"])) for s in range(200)]
        assert len(set(first)) > 1, "samples draw independently"


def test_a_one_part_task_seeing_nothing_draws_as_before_review_existed() -> None:
    spec = agent("a", skills={"geo": 0.5})
    for s in range(200):
        u = sim.draw("answer", "t", "a", s, 1)
        assert (answer(spec, single(s)) == "Paris") == (u < 0.5)


@pytest.mark.parametrize("rate", [0.0, 0.3, 0.8, 1.0])
def test_a_reviewer_keeps_a_right_answer_at_its_review_rate(rate: float) -> None:
    """Skill 0: whatever it keeps is the earlier answer, so the share right is the rate."""
    reviewer = agent("r", skills={"geo": 0.0}, review={"geo": rate})
    kept = sum(answer(reviewer, single(s, ["Paris"])) == "Paris" for s in range(SAMPLES))
    assert kept / SAMPLES == pytest.approx(rate, abs=0.03)


def test_a_reviewer_that_does_not_keep_answers_as_usual() -> None:
    """Review 0.5, skill 0.6: right = 0.5 + 0.5 x 0.6 with a right draft, 0.6 with a wrong one
    or none."""
    reviewer = agent("r", skills={"geo": 0.6}, review={"geo": 0.5})
    right_draft = sum(answer(reviewer, single(s, ["Paris"])) == "Paris" for s in range(SAMPLES))
    wrong_draft = sum(answer(reviewer, single(s, [sim.UNSURE])) == "Paris"
                      for s in range(SAMPLES))
    assert right_draft / SAMPLES == pytest.approx(0.8, abs=0.03)
    assert wrong_draft / SAMPLES == pytest.approx(0.6, abs=0.03)


def test_a_composite_task_is_right_only_when_both_parts_are_covered() -> None:
    geo = agent("g", skills={"geo": 1.0, "chem": 0.0}, review={"chem": 1.0})
    chem = agent("c", skills={"geo": 0.0, "chem": 1.0}, review={"geo": 1.0})
    alone = [answer(geo, composite(s)) for s in range(50)] + \
        [answer(chem, composite(s)) for s in range(50)]
    assert set(alone) == {f"Paris; {sim.UNSURE}", f"{sim.UNSURE}; Au"}, "one part each"
    for s in range(50):
        draft = answer(geo, composite(s))
        assert answer(chem, composite(s, [draft])) == "Paris; Au", "the split covers both"
        assert answer(chem, composite(s, [])) != "Paris; Au", "not seeing the draft: half"
    weights = score_run("completed", "Paris; Au", "Paris; Au", "exact").value
    assert weights == 1.0
    assert score_run("completed", f"Paris; {sim.UNSURE}", "Paris; Au", "exact").value == 0.5


def test_a_composite_part_is_kept_only_at_the_final_agents_review_rate() -> None:
    """The chem specialist who does not review geo drops the geo part it saw: the plan must
    reach a competent agent for each part *and* keep it to the final step."""
    chem = agent("c", skills={"geo": 0.0, "chem": 1.0})
    assert all(answer(chem, composite(s, ["Paris; I am not sure."])) == f"{sim.UNSURE}; Au"
               for s in range(50))


def test_a_composite_task_whose_answer_does_not_list_every_part_is_refused() -> None:
    with pytest.raises(ValueError, match="parts names 2 parts but the answer has 1"):
        Task(question="q", reference="Paris", parts=["geo", "chem"])
