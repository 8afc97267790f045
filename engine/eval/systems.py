"""The systems `conductor eval` compares, each written as the tasks it runs.

Every system answers the same tasks as ordinary runs of ConductWorkflow, so an eval is one
batch: durable, resumable, and every run visible in the Temporal UI. The conductor plans as it
always does; each baseline is a fixed plan (RunOptions.plan) the run executes without asking
the conductor:

- `single`: each agent alone, one step (and, at report time, `best single`: the best of them
  on this run's tasks, the paper's "best individual agent");
- `moa`: Mixture-of-Agents (Wang et al. 2024): every agent proposes, each later layer's
  agents see the previous layer's answers, an aggregator writes the final answer;
- `random`: a random plan (1-5 steps, random agents, random valid access), seeded per task;
- `chain`: a fixed planner -> executor -> verifier chain on one agent;
- with `rounds` N: the conductor with 0..N refinement rounds (the test-time-scaling curve).

A run's task id is `SYSTEM~TASK`, which is how the report groups runs by system. With
`repeats` R > 1 each system runs each task R times, the later runs `SYSTEM~TASK~r` (r = 1..R-1):
agents that sample (temperature > 0, the sim's seeded draws) answer each run afresh, so the
report's means are over R runs a task rather than one, whose luck on a small task set can
outweigh the gaps between systems.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from conductor_engine.engine.contracts.plans import Plan, Step
from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.contracts.tasks import Task

Baseline = Literal["single", "moa", "random", "chain"]
BASELINES: tuple[Baseline, ...] = ("single", "moa", "random", "chain")
SEPARATOR = "~"
MAX_REPEATS = 32
CONDUCTOR = "conductor"

SOLO = "Solve the task completely and state the final answer clearly."
PROPOSE = "Answer the task as well as you can."
REFINE = ("Read the answers of the other models above, then give your own best answer to the "
          "task, correcting their mistakes.")
AGGREGATE = ("Synthesize the answers above into one final answer: weigh them critically, keep "
             "what is right, and state the final answer clearly.")
CHAIN = (
    "Write a short step-by-step plan for solving the task. Do not solve it.",
    "Follow the plan above and solve the task.",
    "Check the solution above for mistakes, fix any you find, and state the final answer "
    "clearly.",
)
RANDOM_WORK = "Work on the task and share what you find."
RANDOM_LAST = "Give the final answer to the task, stated clearly."


class EvalSpec(BaseModel):
    """What `conductor eval` runs: which systems, on which agents."""

    agents: list[str] = Field(min_length=1, description="the pool's agent ids, in pool order")
    policy_version: str | None = Field(
        default=None, description="the conductor's version (None: what the pool file follows)")
    baselines: list[Baseline] = Field(default_factory=lambda: list(BASELINES))
    rounds: int = Field(default=0, ge=0, le=5, description="refinement rounds 0..N")
    moa_layers: int = Field(default=2, ge=1, le=4, description="proposer layers before the "
                            "aggregator")
    aggregator: str | None = Field(default=None, description="MoA's aggregator (default: the "
                                   "first agent)")
    chain_agent: str | None = Field(default=None, description="the chain's agent (default: "
                                    "the aggregator)")
    seed: int = Field(default=0, ge=0, description="seeds the random plans")
    repeats: int = Field(
        default=1, ge=1, le=MAX_REPEATS,
        description="runs of each task by each system; the report's accuracy, reward, tokens "
        "and cost are means over all of them (one run a task measures the agents' luck as much "
        "as the system when they sample)")
    conductor_agents: list[str] | None = Field(
        default=None, min_length=1,
        description="the agents the conductor's runs may delegate to (Task.agents), when some "
        "of the pool's were left out as unable to run here (engine/eval/usable.py); None = "
        "the whole pool")

    @model_validator(mode="after")
    def _known_agents(self) -> EvalSpec:
        for role, agent in (("aggregator", self.aggregator), ("chain agent", self.chain_agent)):
            if agent is not None and agent not in self.agents:
                raise ValueError(f"the {role} {agent!r} is not in the pool (agents: "
                                 f"{', '.join(self.agents)})")
        return self

    @property
    def lead(self) -> str:
        return self.aggregator or self.agents[0]


def run_id(system: str, task_id: str) -> str:
    return f"{system}{SEPARATOR}{task_id}"


def system_of(task_id: str) -> str:
    return task_id.split(SEPARATOR, 1)[0]


def conductor_systems(spec: EvalSpec) -> list[tuple[str, int]]:
    """(system name, refinement rounds) of the conductor's systems."""
    if not spec.rounds:
        return [(CONDUCTOR, 0)]
    return [(f"{CONDUCTOR} r{r}", r) for r in range(spec.rounds + 1)]


def moa_plan(agents: Sequence[str], aggregator: str, layers: int) -> Plan:
    steps: list[Step] = []
    previous: list[int] = []
    for layer in range(layers):
        start = len(steps)
        for a in agents:
            steps.append(Step(agent=a, subtask=PROPOSE if layer == 0 else REFINE,
                              access=list(previous)))
        previous = list(range(start, len(steps)))
    steps.append(Step(agent=aggregator, subtask=AGGREGATE, access=previous))
    return Plan(steps=steps)


def chain_plan(agent: str) -> Plan:
    return Plan(steps=[Step(agent=agent, subtask=CHAIN[0], access=[]),
                       Step(agent=agent, subtask=CHAIN[1], access=[0]),
                       Step(agent=agent, subtask=CHAIN[2], access="all")])


def random_plan(agents: Sequence[str], seed: str) -> Plan:
    """1-5 steps of random agents, each seeing all, none or a random set of earlier steps;
    the same plan for the same seed string on every run."""
    rng = random.Random(int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "big"))
    n = rng.randint(1, 5)
    steps = []
    for i in range(n):
        choice = rng.randrange(3) if i else 1
        access: Literal["all"] | list[int] = (
            "all" if choice == 0 else [] if choice == 1
            else sorted(rng.sample(range(i), rng.randint(1, i))))
        steps.append(Step(agent=rng.choice(list(agents)),
                          subtask=RANDOM_LAST if i == n - 1 else RANDOM_WORK, access=access))
    return Plan(steps=steps)


def _fixed(task: Task, system: str, plan: Plan) -> Task:
    options = revised(task.options, plan=plan, refinement_rounds=0)
    return revised(task, id=run_id(system, task.id), options=options)


def _conductor_agents(task: Task, spec: EvalSpec) -> list[str] | None:
    """The agents the conductor's run of `task` may use: the task's own (if it names them)
    less those left out, else the spec's; the task's own when none of them is left (the run
    then fails and is counted as failed, not quietly given other agents)."""
    if spec.conductor_agents is None:
        return task.agents
    if task.agents is None:
        return list(spec.conductor_agents)
    kept = [a for a in task.agents if a in spec.conductor_agents]
    return kept or task.agents


def eval_tasks(tasks: Sequence[Task], spec: EvalSpec) -> list[Task]:
    """Every run of the eval: each task once per system, `spec.repeats` times (a later
    repeat's id ends `~r`, a run of its own with its own draws; the first keeps the id an eval
    of one repeat gives it)."""
    return [run for task in tasks for again in repeated(task, spec.repeats)
            for run in _task_runs(again, spec)]


def repeated(task: Task, repeats: int) -> list[Task]:
    """The task once per repeat: the first as it is, the r-th (from 1) with id `TASK~r`."""
    return [task, *(revised(task, id=f"{task.id}{SEPARATOR}{r}") for r in range(1, repeats))]


def _task_runs(task: Task, spec: EvalSpec) -> list[Task]:
    """One task's run by each system."""
    out: list[Task] = []
    agents = _conductor_agents(task, spec)
    for system, rounds in conductor_systems(spec):
        out.append(revised(task, id=run_id(system, task.id), agents=agents, options=revised(
            task.options, refinement_rounds=rounds, policy_version=spec.policy_version,
            plan=None)))
    if "single" in spec.baselines:
        out.extend(_fixed(task, f"single {a}", Plan(steps=[Step(agent=a, subtask=SOLO,
                                                               access=[])]))
                   for a in spec.agents)
    if "moa" in spec.baselines:
        out.append(_fixed(task, "moa", moa_plan(spec.agents, spec.lead, spec.moa_layers)))
    if "random" in spec.baselines:
        out.append(_fixed(task, "random", random_plan(spec.agents,
                                                      f"{spec.seed}\x1f{task.id}")))
    if "chain" in spec.baselines:
        out.append(_fixed(task, "chain", chain_plan(spec.chain_agent or spec.lead)))
    return out
