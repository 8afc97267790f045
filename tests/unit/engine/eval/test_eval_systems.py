"""The runs an eval is made of (engine/eval/systems.py): repeats."""

from __future__ import annotations

from collections import Counter

from conductor_engine.engine.contracts.agent_calls import TaskInfo
from conductor_engine.engine.contracts.agents import SimSettings
from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.eval import EvalSpec, eval_tasks
from conductor_engine.engine.eval.systems import system_of
from conductor_engine.engine.providers.pool import AgentSpec
from conductor_engine.engine.providers.sim import is_right

TASKS = [Task(id=f"t{i}", question=f"q{i}?", reference="42") for i in range(3)]
AGENTS = ["a", "b"]
SPEC = EvalSpec(agents=AGENTS, baselines=["single", "moa"])


def test_each_repeat_runs_every_system_on_every_task_as_runs_of_their_own() -> None:
    once = eval_tasks(TASKS, SPEC)
    thrice = eval_tasks(TASKS, EvalSpec(agents=AGENTS, baselines=["single", "moa"], repeats=3))
    assert len(thrice) == 3 * len(once)
    assert len({t.id for t in thrice}) == len(thrice), "every run has its own id"
    assert {t.id for t in once} < {t.id for t in thrice}, "the first repeat keeps its ids"
    per_system = Counter(system_of(t.id) for t in thrice)
    assert per_system == {s: 3 * len(TASKS) for s in ("conductor", "single a", "single b",
                                                       "moa")}
    assert {t.question for t in thrice} == {t.question for t in TASKS}
    assert {t.reference for t in thrice} == {"42"}


def test_a_sampling_agent_answers_each_repeat_afresh() -> None:
    """What repeats are for: the sim draws each run from its own id, so an agent right half
    the time is right on some repeats of a task and wrong on others, where one run a task
    would have scored it 0 or 1 on that task."""
    agent = AgentSpec(id="a", provider="sim", model="sim")
    settings = SimSettings(default_skill=0.5)
    spec = EvalSpec(agents=AGENTS, baselines=["single"], repeats=16)
    runs = [t for t in eval_tasks(TASKS[:1], spec) if system_of(t.id) == "single a"]
    right = [is_right(agent, settings, TaskInfo(task_id=t.id, reference="42")) for t in runs]
    assert len(right) == 16 and 3 < sum(right) < 13, right
