"""The plan as a value (engine/contracts/plans.py)."""

from __future__ import annotations

from conductor_engine.engine.contracts.plans import Access, Plan, Step, dead_steps


def plan(*access: Access) -> Plan:
    return Plan(steps=[Step(agent=f"a{i}", subtask="Do it.", access=a)
                       for i, a in enumerate(access)])


def test_a_step_is_dead_when_no_step_on_a_path_to_the_last_one_sees_it() -> None:
    """The last step's output is the answer: a draft it is blind to, and a step only a dead
    step reads, never reach it; a step read through a live one does."""
    assert plan([]).dead_steps() == []
    assert plan([], "all").dead_steps() == []
    assert plan([], []).dead_steps() == [0]
    assert plan([], [], [0, 1]).dead_steps() == []
    assert plan([], [0], [1]).dead_steps() == []
    assert plan([], [0], []).dead_steps() == [0, 1]
    assert plan([], [], [1]).dead_steps() == [0]
    assert plan([], "all", [], "all").dead_steps() == []
    assert Plan().dead_steps() == [] and dead_steps([]) == []
