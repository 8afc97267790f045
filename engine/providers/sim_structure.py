"""Rehearsal pools where a plan's shape matters, generated from a seed, with each task's oracle.

`conductor sim pool --structure --seed S` writes a pool of four look-alike sim agents, a task
file and `oracle.jsonl` beside it. The seed picks the names, which agent plays which role and
which of the generator's task kinds (engine/providers/sim_pool.py) play which part:

- `one` (tags A and B): a cheap specialist answers alone (one step);
- `review` (tag R): two cheap agents each right about 60 % of the time, each a good reviewer of
  R; the best plan is a draft and a second agent that sees it (draft + review);
- `split` (parts A and B, one composite task): no agent is good at both; the best plan asks A's
  specialist, then B's specialist, who sees the first answer and keeps it (split);
- `generalist` (tag G): only the expensive generalist is good at it (one step, a dear one).

The generalist is fair at everything and costs about twenty specialists; the tasks' reward
charges cost (`RewardWeights.cost_penalty_per_usd`), so it is the right call only where nobody
else will do. The oracle searches every plan a task allows (`max_steps` = 2: one agent, or two
with or without the second seeing the first) and scores each exactly: `expected` enumerates the
sim's independent draws (engine/providers/sim.py) of the agents in the plan.

Everything is a pure function of the arguments (SHA-256 draws), like sim_pool.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, Field

from conductor_engine.engine.contracts.agents import AgentSpec
from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.providers.sim import SEPARATOR
from conductor_engine.engine.providers.sim_pool import (
    _BANK,
    DESCRIPTION,
    NAMES,
    _ranked,
    conductor_section,
)

Kind = Literal["one", "review", "split", "generalist"]
KINDS: tuple[Kind, ...] = ("one", "review", "split", "generalist")
Shape = Literal["1 step", "draft + review", "split", "2 apart"]
MAX_TASKS_PER_KIND = 8  # the one and split kinds share tag A's and B's 16 bank items


class AgentRole(BaseModel):
    """One agent as the oracle sees it: skills and review rates per tag, and what a call of it
    costs (generated here, or read off any sim pool's file by `roles_of`)."""

    skills: dict[str, float]
    review: dict[str, float] = Field(default_factory=dict)
    default_skill: float
    default_review: float = 0.0
    output_tokens: int
    price_output_per_mtok: float

    def cost(self) -> float:
        """US dollars per call (input is free in these pools, so a call's cost is fixed)."""
        return self.output_tokens * self.price_output_per_mtok / 1e6


class PlanStep(BaseModel):
    agent: str
    sees: list[int] = Field(default_factory=list, description="earlier steps it reads")


class Oracle(BaseModel):
    """The best plan of one task and what it is worth (a row of oracle.jsonl)."""

    id: str
    kind: str = Field(description="one, review, split or generalist in a generated pool; the "
                      "task's tag (its parts joined by +) in a pool read from files")
    shape: Shape
    plan: list[PlanStep]
    p_right: float
    cost_usd: float
    expected_reward: float


class StructuredPoolSpec(BaseModel):
    """What `conductor sim pool --structure` generates."""

    seed: int = Field(default=0, ge=0, le=2**31)
    tasks_per_kind: int = Field(default=8, ge=1, le=MAX_TASKS_PER_KIND)
    high: float = Field(default=0.95, ge=0, le=1, description="a specialist's skill")
    low: float = Field(default=0.1, ge=0, le=1, description="skill outside one's trade")
    draft: float = Field(default=0.55, ge=0, le=1, description="a drafter's skill on R")
    generalist: float = Field(default=0.7, ge=0, le=1,
                              description="the generalist's skill on A, B and R")
    generalist_own: float = Field(default=0.9, ge=0, le=1,
                                  description="the generalist's skill on G")
    review: float = Field(default=0.95, ge=0, le=1, description="a reviewer's keep rate")
    wrong: float = Field(default=0.25, ge=0, le=1, description="reward of a wrong answer")
    cost_penalty_per_usd: float = Field(default=5.0, ge=0)
    subtask_chars: int = Field(default=8, ge=8, le=2000)

    def names(self) -> list[str]:
        return _ranked(NAMES, self.seed, "structure-names")[:4]

    def tags(self) -> dict[str, str]:
        """Role letter (A, B, R, G) -> the bank tag playing it."""
        picked = _ranked(list(_BANK), self.seed, "structure-tags")[:4]
        return dict(zip("ABRG", picked, strict=True))

    def roles(self) -> dict[str, str]:
        """Role -> agent name: the generalist and the specialists of A, B and R."""
        return dict(zip(("generalist", "A", "B", "R"), self.names(), strict=True))

    def agents(self) -> dict[str, AgentRole]:
        """agent -> its role: who is good at what, who reviews what, and the price."""
        t, r = self.tags(), self.roles()
        lo, hi = self.low, self.high
        cheap = {"output_tokens": 100, "price_output_per_mtok": 10.0}
        return {
            r["generalist"]: AgentRole(
                skills={t["A"]: self.generalist, t["B"]: self.generalist,
                        t["R"]: self.generalist, t["G"]: self.generalist_own},
                default_skill=lo, output_tokens=400, price_output_per_mtok=60.0),
            r["A"]: AgentRole(
                skills={t["A"]: hi, t["B"]: lo, t["R"]: self.draft, t["G"]: 0.3},
                review={t["B"]: self.review, t["R"]: self.review}, default_skill=lo, **cheap),
            r["B"]: AgentRole(
                skills={t["A"]: lo, t["B"]: hi, t["R"]: lo, t["G"]: 0.3},
                review={t["A"]: self.review}, default_skill=lo, **cheap),
            r["R"]: AgentRole(
                skills={t["A"]: lo, t["B"]: lo, t["R"]: self.draft, t["G"]: 0.3},
                review={t["R"]: self.review}, default_skill=lo, **cheap),
        }

    def options(self) -> dict[str, object]:
        return {"max_steps": 2, "subtask_max_chars": self.subtask_chars,
                "reward": {"wrong": self.wrong,
                           "cost_penalty_per_usd": self.cost_penalty_per_usd}}


# --- the oracle ----------------------------------------------------------------------------


def p_right(plan: Sequence[PlanStep], agents: dict[str, AgentRole],
            parts: Sequence[str]) -> float:
    """The probability that the plan's final answer is right, exactly: every (agent, part)
    answer draw and review draw of the sim is an independent Bernoulli (the same agent twice
    in a plan draws the same, as the sim does), so enumerate them all."""
    used = sorted({s.agent for s in plan})
    keys = [(a, k) for a in used for k in range(len(parts))]
    total = 0.0
    for bits in itertools.product((False, True), repeat=2 * len(keys)):
        own = dict(zip(keys, bits[: len(keys)], strict=True))
        keep = dict(zip(keys, bits[len(keys):], strict=True))
        weight = 1.0
        for (a, k), b in own.items():
            p = _rate(agents[a].skills, parts[k], agents[a].default_skill)
            weight *= p if b else 1 - p
        for (a, k), b in keep.items():
            p = _rate(agents[a].review, parts[k], agents[a].default_review)
            weight *= p if b else 1 - p
        if weight == 0.0:
            continue
        right: list[list[bool]] = []
        for s in plan:
            right.append([(any(right[j][k] for j in s.sees) and keep[s.agent, k])
                          or own[s.agent, k] for k in range(len(parts))])
        if all(right[-1]):
            total += weight
    return total


def _rate(table: dict[str, float], tag: str, default: float) -> float:
    return table.get(tag, default)


def expected_reward(plan: Sequence[PlanStep], agents: dict[str, AgentRole],
                    parts: Sequence[str], wrong: float, penalty: float,
                    correct: float = 1.0) -> tuple[float, float, float]:
    """(expected reward, P(right), cost) of a plan, under scoring.py's rule: the cost penalty
    lowers a positive reward to 0 at most."""
    p = p_right(plan, agents, parts)
    cost = sum(agents[s.agent].cost() for s in plan)
    def charged(base: float) -> float:
        return max(0.0, base - penalty * cost)
    return p * charged(correct) + (1 - p) * charged(wrong), p, cost


def plans(agents: Sequence[str], max_steps: int = 2) -> list[list[PlanStep]]:
    """Every plan of one or two steps: one agent; two, the second seeing the first or not."""
    out: list[list[PlanStep]] = [[PlanStep(agent=a)] for a in agents]
    if max_steps >= 2:
        for a, b in itertools.product(agents, repeat=2):
            out.append([PlanStep(agent=a), PlanStep(agent=b, sees=[0])])
            out.append([PlanStep(agent=a), PlanStep(agent=b)])
    return out


def shape(plan: Sequence[PlanStep], parts: Sequence[str]) -> Shape:
    """How people name a plan: one step, a draft and a reviewer, a split, or two steps apart
    (the last sees nothing, so the first was paid for and thrown away)."""
    if len(plan) == 1:
        return "1 step"
    if not plan[-1].sees:
        return "2 apart"
    return "split" if len(parts) > 1 else "draft + review"


def oracle(task_id: str, kind: str, parts: Sequence[str], spec: StructuredPoolSpec) -> Oracle:
    """The best plan of a generated task."""
    return best_plan(task_id, kind, parts, spec.agents(), spec.wrong, spec.cost_penalty_per_usd)


def best_plan(task_id: str, kind: str, parts: Sequence[str], agents: dict[str, AgentRole],
              wrong: float, penalty: float, correct: float = 1.0) -> Oracle:
    """The best plan of a task among every plan of up to two steps (ties: fewer steps, then
    cheaper, then the first in order)."""
    best: tuple[float, list[PlanStep], float, float] | None = None
    for plan in plans(sorted(agents)):
        value, p, cost = expected_reward(plan, agents, parts, wrong, penalty, correct)
        if best is None or value > best[0] + 1e-12:
            best = (value, plan, p, cost)
    assert best is not None
    value, plan, p, cost = best
    return Oracle(id=task_id, kind=kind, shape=shape(plan, parts), plan=plan,
                  p_right=round(p, 6), cost_usd=round(cost, 6), expected_reward=round(value, 6))


# --- any sim pool's oracle, read off its files --------------------------------------------------


def roles_of(agents: Sequence[AgentSpec]) -> dict[str, AgentRole]:
    """The oracle's view of a sim pool written by hand (or by anyone): each agent's `sim`
    skills, review rates and output tokens, and its price. The oracle is exact only where a
    call's cost does not depend on the prompt, so an agent priced per input token, or one that
    is not a sim agent, is refused with what to change. Tags are folded to lower case, as the
    sim matches them."""
    roles: dict[str, AgentRole] = {}
    for a in agents:
        if a.sim is None:
            raise ValueError(f"agent {a.id!r} has no `sim` settings: the oracle scores sim "
                             "agents only")
        if a.price_input_per_mtok:
            raise ValueError(f"agent {a.id!r} charges for input tokens: the oracle's costs are "
                             "exact only with price_input_per_mtok = 0")
        roles[a.id] = AgentRole(
            skills={t.casefold(): p for t, p in a.sim.skills.items()},
            review={t.casefold(): p for t, p in a.sim.review.items()},
            default_skill=a.sim.default_skill, default_review=a.sim.default_review,
            output_tokens=a.sim.output_tokens,
            price_output_per_mtok=a.price_output_per_mtok or 0.0)
    return roles


def task_parts(task: Task) -> list[str]:
    """The tag of each part the sim answers apart: a composite task's parts, else its one tag
    (a one-part task with several tags takes the best of them in the sim, which `p_right`'s
    one tag per part cannot say, so it is refused)."""
    if task.parts:
        return [p.casefold() for p in task.parts]
    if len(task.tags) != 1:
        raise ValueError(f"task {task.id!r} has {len(task.tags)} tags: the oracle needs one tag "
                         "per task (or `parts` for a composite task)")
    return [task.tags[0].casefold()]


def pool_oracles(agents: Sequence[AgentSpec], tasks: Sequence[Task]) -> dict[str, Oracle]:
    """Each task's best plan and its exact expected reward under the task's own reward
    weights, for a sim pool and task file from anywhere: what `bench_plans --pool` judges a
    hand-written (or hidden) structured pool by. A task's kind is its tag, parts joined by +."""
    roles = roles_of(agents)
    out: dict[str, Oracle] = {}
    for t in tasks:
        parts, weights = task_parts(t), t.options.reward
        out[t.id] = best_plan(t.id, "+".join(parts), parts, roles, weights.wrong,
                              weights.cost_penalty_per_usd, weights.correct)
    return out


# --- the files -----------------------------------------------------------------------------


def structured_tasks(spec: StructuredPoolSpec) -> list[tuple[dict[str, object], Oracle]]:
    """The task file's rows, interleaved by kind, each with its oracle."""
    t = spec.tags()
    dataset = f"sim-structure-{spec.seed}"
    n = spec.tasks_per_kind

    def items(tag: str) -> list[tuple[str, str]]:
        _, pattern, bank = _BANK[tag]
        answers = dict(bank)
        return [(pattern.format(s), answers[s])
                for s in _ranked([s for s, _ in bank], spec.seed, "structure-items", tag)]

    a_items, b_items = items(t["A"]), items(t["B"])
    by_kind: dict[Kind, list[tuple[str, str, list[str], list[str]]]] = {
        # (question, answer, tags, parts)
        "one": [(q, ans, [t["A"] if k % 2 == 0 else t["B"]], [])
                for k, (q, ans) in enumerate(
                    a_items[k // 2] if k % 2 == 0 else b_items[k // 2] for k in range(n))],
        "review": [(q, ans, [t["R"]], []) for q, ans in items(t["R"])[:n]],
        "split": [(f"Answer both, separated by a semicolon: (1) {qa} (2) {qb}",
                   f"{aa}{SEPARATOR}{ab}", [f"{t['A']}+{t['B']}"], [t["A"], t["B"]])
                  for (qa, aa), (qb, ab) in zip(a_items[n:2 * n], b_items[n:2 * n],
                                                strict=True)],
        "generalist": [(q, ans, [t["G"]], []) for q, ans in items(t["G"])[:n]],
    }
    rows: list[tuple[dict[str, object], Oracle]] = []
    best: dict[tuple[str, ...], Oracle] = {}  # the oracle depends only on the parts' tags
    for k in range(n):
        for kind in KINDS:
            q, ans, tags, parts = by_kind[kind][k]
            task_id = f"{dataset}-{kind}-{k}"
            row: dict[str, object] = {"id": task_id, "question": q, "answer": ans,
                                      "verifier": "exact", "tags": tags, "dataset": dataset,
                                      "options": spec.options()}
            if parts:
                row["parts"] = parts
            key = tuple(parts or tags)
            if key not in best:
                best[key] = oracle(task_id, kind, key, spec)
            rows.append((row, revised(best[key], id=task_id, kind=kind)))
    return rows


def structured_pool_toml(spec: StructuredPoolSpec, conductor: str = "smollm2-135m-instruct"
                         ) -> str:
    """The pool file: the local conductor in the bare plan form, and the four sim agents."""
    lines = [
        f"# Generated by `conductor sim pool --structure --seed {spec.seed}`: look-alike sim",
        "# agents; skills, review rates and prices below are what the conductor must learn",
        "# (oracle.jsonl beside the tasks gives each task's best plan;",
        "# docs/how-to/rehearse-plans.md).",
        "",
        *conductor_section(conductor, max_tokens=128),
    ]
    for name, role in spec.agents().items():
        skills = ", ".join(f"{t} = {p}" for t, p in role.skills.items())
        review = ", ".join(f"{t} = {p}" for t, p in role.review.items())
        review = f"{{ {review} }}" if review else "{}"
        lines += [
            "",
            "[[agents]]",
            f'id = "{name}"',
            'provider = "sim"',
            'model = "sim"',
            f'description = "{DESCRIPTION}"',
            "price_input_per_mtok = 0.0",
            f"price_output_per_mtok = {role.price_output_per_mtok}",
            f"sim = {{ skills = {{ {skills} }}, review = {review}, "
            f"default_skill = {role.default_skill}, output_tokens = {role.output_tokens} }}",
        ]
    return "\n".join(lines) + "\n"
