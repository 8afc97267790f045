"""Credit per shape against the shipped credit, on a tabular policy over a structured pool's plans.

    python tests/benchmarks/bench_shape_credit.py [--seed 1] [--iterations 40] [--runs 8]
        [--group 8] [--second-step 0.02] [--rows "plan order,shape first,warm-up"]
        [--warmup-tie mean,fewer0.1] [--warmup-rehearse-plans 4] [--grpo-lr 0.01]

What the method changes is who gets credit, not the model, so this measures it where nothing
else varies: one softmax table per task kind of `conductor sim pool --structure --seed S`
(engine/providers/sim_structure.py) for each decision of a plan (the first agent; `,` or `]`
given it; the second agent given the first; whether the second sees the first, given both),
started where SmolLM2 starts (a second step with probability `--second-step`, everything else
uniform), and a group of G sampled plans per kind per iteration, rewarded as the sim rewards
them (right with the plan's exact P(right), charged its cost). Each method takes one Adam step
per iteration on the same draws' budget:

- `group`: GRPO's group baseline, every decision credited with R - mean(group);
- `group + explore 0.5`: the same with the shipped plans recipe's exploring rollouts (each
  decision uniform over its options with probability 0.5, credited as the policy's);
- `shape + force`: credit per shape (trainer/grpo/_shapes.py, its own code, on the plans'
  JSON text), `--force` of each group forced to the three shapes in turn, annealed over
  `--anneal` iterations, then forced only where every unforced rollout failed (and the same
  with exploring rollouts); `shape by first agent + force`: the same, the means taken among
  the rollouts that drafted with the same first agent (a probe, not what the trainer ships);
- `exact`: the exact gradient of sum over plans of pi(p) E[R | p] (no sampling), the yardstick
  of what ascent can reach from this start at all.

`shape first: ...` rows (`--rows "shape first"`) take the plan form that writes a plan's shape
before its agents: per kind a softmax over the three shapes, then the first agent given the
shape, then the second given both (the access is the shape's), started at the same second-step
probability. Trained by the group credit, by the trainer's shape advantages (the shape token
credited b(s) - b(()), every agent R - b(s)) with and without forcing, and by the exact
gradient.

`warm-up ...` rows (`--rows warm-up`) start GRPO (the group credit, or credit per shape with
forcing: the row's name after the warm-up's) from a warm start: for each of
`--warmup-tasks` tasks a kind, `--warmup-samples` exploring samples (each decision uniform with
probability `--warmup-explore`), one plan selected per task, `--warmup-steps` Adam steps of
cross-entropy towards the selected plans. `best run`: the warm-up as shipped (trainer/warmup.py:
the best right run by realised reward, ties by cost); `best mean of R`: each distinct sampled
plan rehearsed R more times, ranked by its mean reward over all its runs, then runs, then cost.
A second table says how often each kind's selected plan was an oracle plan, the runs a task
paid for, and the expected reward and the kinds shaped right right after the warm-up.

`--rows candidates` varies where the rehearsed warm-up's candidates come from: `forced`, of a
task's samples `--warmup-force` are forced to each two-step shape (its shape decisions fixed,
its agents drawn as any sample's, exploring alike), the rest free; `K rounds`, expert
iteration: each round samples from the policy the last round's fine-tuning left (with the
same exploring and forcing), rehearses the plans not rehearsed before, ranks every plan of
every round by its mean over all its runs, and fine-tunes on the new selections.

`--rows "plan mean"` compares what a rollout is credited with: its own draw (`group`) or its
plan's mean over every run of its task so far, the warm-up's samples and rehearsals included
(`by plan mean`, `[rollouts] reward = "plan_mean"`, trainer/plan_means.py; each kind's group of
an iteration is one of its `--warmup-tasks` tasks in turn), from the untrained start and after
the shipped warm-up (forced, 3 rounds; with `--warmup-tie fewer0.1 --warmup-rehearse-plans 4`
as the product selects), GRPO exploring at 0.25 as the plans recipe does (`--grpo-lr` for
its smaller step after a warm-up).

`--rows borrowed` is the forced 4-round rehearsed warm-up as shipped, then with each task also
running the plans its kind's other tasks selected in the last round (`borrowed`: a plan one task
found, tried on its siblings), then with each task's two leading plans run `R` more times every
round however often they ran (`raced`: a lucky mean gets more draws).

`--rows ties` is the forced 3-round rehearsed warm-up alone, to compare how it selects a task's
plan (`--warmup-tie`, comma-separated, each a row; `all` for every rule in TIES): the best
mean, the cheapest plan within C standard errors of it (`cheaperC`), fewer steps first (a plan
of more steps only if its mean beats the best plan of fewer steps by more than M, `fewerM`, or
by more than C of the pair's combined standard error, `fewerCse`), or the best lower bound,
mean - C standard errors (`lcbC`). `--warmup-rehearse-plans K` rehearses, as the product does,
only each task's K best candidates not rehearsed before (by mean, among plans with a right
run) and selects among plans with a right run; by default every new plan is rehearsed. A
third table gives, per kind, how many runs' greedy plans have the oracle's number of steps
right after the warm-up and after GRPO, and the shares over the one-step and two-step kinds.

Printed per method, over `--runs` seeds: the exact expected reward of the final policy over the
oracle's (mean over the four kinds), the greedy plan's, and how many kinds' greedy plans have
the oracle's shape; and the ratio of each to `group`'s (the obvious baseline), measured in the
same run. A tabular policy is not SmolLM2: this says what the credit does, not what the model
can represent (that is the exact-gradient yardstick's question, bench_exact_gradient.py).
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from conductor_engine.engine.contracts.plan_shapes import (
    Shape,
    forced_rollouts,
    forced_shape,
    shapes,
)
from conductor_engine.engine.providers.sim_structure import (
    KINDS,
    PlanStep,
    StructuredPoolSpec,
    expected_reward,
    p_right,
    structured_tasks,
)
from conductor_engine.trainer.grpo._shapes import (
    ShapedRollout,
    shape_advantages,
    shaped_rollout,
)

Plan = tuple[int, int | None, bool]  # first agent; second agent (None: one step); sees
SHAPES = shapes(2)  # 1 step; two, the second seeing the first; two apart


@dataclass
class Kind:
    """One task kind: its plans' exact values and the pieces of sim scoring a draw needs."""

    name: str
    p: dict[Plan, float]
    cost: dict[Plan, float]
    right: dict[Plan, float]  # the reward when right / wrong (cost charged)
    wrong: dict[Plan, float]
    value: dict[Plan, float]
    oracle: Plan


def kinds(seed: int) -> tuple[list[str], list[Kind]]:
    spec = StructuredPoolSpec(seed=seed, tasks_per_kind=1)
    agents = spec.agents()
    names = sorted(agents)
    out = []
    for row, oracle in structured_tasks(spec):
        parts = list(row.get("parts") or row["tags"])  # type: ignore[call-overload]
        table: dict[str, dict[Plan, float]] = {
            "p": {}, "cost": {}, "right": {}, "wrong": {}, "value": {}}
        for a in range(len(names)):
            for b in [None, *range(len(names))]:
                for sees in ((False,) if b is None else (True, False)):
                    steps = [PlanStep(agent=names[a])] + (
                        [] if b is None else [PlanStep(agent=names[b], sees=[0] if sees else [])])
                    value, p, cost = expected_reward(steps, agents, parts, spec.wrong,
                                                     spec.cost_penalty_per_usd)
                    plan = (a, b, sees)
                    table["p"][plan] = p_right(steps, agents, parts)
                    table["cost"][plan] = cost
                    table["right"][plan] = max(0.0, 1.0 - spec.cost_penalty_per_usd * cost)
                    table["wrong"][plan] = max(0.0, spec.wrong - spec.cost_penalty_per_usd * cost)
                    table["value"][plan] = value
        o = oracle.plan
        best: Plan = (names.index(o[0].agent), None if len(o) == 1 else names.index(o[1].agent),
                      len(o) > 1 and bool(o[1].sees))
        out.append(Kind(oracle.kind, table["p"], table["cost"], table["right"], table["wrong"],
                        table["value"], best))
    return names, sorted(out, key=lambda k: KINDS.index(k.name))  # type: ignore[arg-type]


class Policy(torch.nn.Module):
    """Softmax tables for one kind: first agent; more | end given it; second agent given the
    first; sees | apart given both."""

    def __init__(self, n: int, second_step: float) -> None:
        super().__init__()
        import math

        self.first = torch.nn.Parameter(torch.zeros(n))
        more = math.log(second_step / (1 - second_step))
        self.more = torch.nn.Parameter(torch.tensor([[more, 0.0]] * n))  # [more, end]
        self.second = torch.nn.Parameter(torch.zeros(n, n))
        self.sees = torch.nn.Parameter(torch.zeros(n, n, 2))  # [sees, apart]

    def decisions(self, plan: Plan) -> list[torch.Tensor]:
        """log pi of each of the plan's decisions, in the order the plan writes them."""
        a, b, sees = plan
        out = [torch.log_softmax(self.first, 0)[a],
               torch.log_softmax(self.more[a], 0)[0 if b is not None else 1]]
        if b is not None:
            out += [torch.log_softmax(self.second[a], 0)[b],
                    torch.log_softmax(self.sees[a, b], 0)[0 if sees else 1]]
        return out

    def plan_probs(self, plans: list[Plan]) -> torch.Tensor:
        return torch.stack([torch.stack(self.decisions(p)).sum() for p in plans]).exp()

    def draw(self, rng: random.Random, explore: float, force: Shape | None
             ) -> tuple[Plan, list[bool]]:
        """A plan from the policy (each decision uniform with probability `explore`), its
        shape forced to `force`; and which decisions were forced."""
        with torch.no_grad():
            a, _ = pick(self.first, rng, explore, None)
            m, fm = pick(self.more[a], rng, explore,
                         None if force is None else (0 if force[0] == "more" else 1))
            if m == 1:
                return (a, None, False), [False, fm]
            b, _ = pick(self.second[a], rng, explore, None)
            s, fs = pick(self.sees[a, b], rng, explore,
                         None if force is None else (0 if force[1] == "sees" else 1))
            return (a, b, s == 0), [False, fm, False, fs]

    def shaped(self, plan: Plan, reward: float, forced: bool, names: list[str]
               ) -> tuple[ShapedRollout, list[int]]:
        """The rollout as the trainer's shape credit reads it, from the plan's JSON text, and
        the indices of its decisions' tokens."""
        texts, at = pieces(plan, names)
        return shaped_rollout(texts, reward, forced=forced), at


class ShapeFirst(torch.nn.Module):
    """The plan form that writes its shape before its agents: softmax tables for one kind over
    the shape (1 step, two steps the second seeing the first, two apart); the first agent
    given the shape; the second agent given the shape and the first. A step's access is the
    shape's. Started where `Policy` starts: a second step with probability `second_step`, split
    evenly between seeing and not; every agent uniform."""

    def __init__(self, n: int, second_step: float) -> None:
        super().__init__()
        import math

        half = math.log(second_step / 2)
        self.shape = torch.nn.Parameter(torch.tensor([math.log(1 - second_step), half, half]))
        self.first = torch.nn.Parameter(torch.zeros(3, n))
        self.second = torch.nn.Parameter(torch.zeros(2, n, n))  # shapes 1 and 2 (two steps)

    @staticmethod
    def shape_of(plan: Plan) -> int:
        return 0 if plan[1] is None else (1 if plan[2] else 2)

    def decisions(self, plan: Plan) -> list[torch.Tensor]:
        """log pi of each decision, in the order this form writes them: shape, agents."""
        a, b, _ = plan
        s = self.shape_of(plan)
        out = [torch.log_softmax(self.shape, 0)[s], torch.log_softmax(self.first[s], 0)[a]]
        if b is not None:
            out.append(torch.log_softmax(self.second[s - 1, a], 0)[b])
        return out

    def plan_probs(self, plans: list[Plan]) -> torch.Tensor:
        return torch.stack([torch.stack(self.decisions(p)).sum() for p in plans]).exp()

    def draw(self, rng: random.Random, explore: float, force: Shape | None
             ) -> tuple[Plan, list[bool]]:
        with torch.no_grad():
            s, fs = pick(self.shape, rng, explore,
                         None if force is None else SHAPES.index(force))
            a, _ = pick(self.first[s], rng, explore, None)
            if s == 0:
                return (a, None, False), [fs, False]
            b, _ = pick(self.second[s - 1, a], rng, explore, None)
            return (a, b, s == 1), [fs, False, False]

    def shaped(self, plan: Plan, reward: float, forced: bool, names: list[str]
               ) -> tuple[ShapedRollout, list[int]]:
        """The rollout as the trainer's shape credit reads it: the shape token decides every
        outcome (so it is credited b(s) - b(())), the agents after it are measured against
        their shape's mean (R - b(s)); nothing is decided before the shape, so the pooling's
        bias (Delta in trainer/grpo/_shapes.py) is zero here."""
        shape = SHAPES[self.shape_of(plan)]
        n = 2 if plan[1] is None else 3
        return (ShapedRollout(reward, shape, [0] + [len(shape)] * (n - 1),
                              [0] + [None] * (n - 1), forced), list(range(n)))


def pick(logits: torch.Tensor, rng: random.Random, explore: float, forced_to: int | None
         ) -> tuple[int, bool]:
    """One decision: forced, uniform (with probability `explore`), or from the softmax."""
    if forced_to is not None:
        return forced_to, True
    if explore and rng.random() < explore:
        return rng.randrange(len(logits)), False
    probs = torch.softmax(logits.detach(), 0).tolist()
    return rng.choices(range(len(probs)), probs)[0], False


def pieces(plan: Plan, names: list[str]) -> tuple[list[str], list[int]]:
    """The plan's JSON as the grammar writes it, a piece per token, and the decision pieces'
    indices (the rest forced)."""
    a, b, sees = plan
    out = ['{"steps":[{"agent":"', names[a], '","subtask":"go","access":[]}']
    at = [1]
    if b is None:
        out += ["]", "}"]
        return out, [*at, 3]
    out += [",", '{"agent":"', names[b], '","subtask":"go","access":',
            '"all"' if sees else "[]", "}", "]", "}"]
    return out, [*at, 3, 5, 7]


def reward_draw(k: Kind, plan: Plan, rng: random.Random) -> tuple[bool, float]:
    """One run of the plan as the sim scores it: right with its exact P(right), charged its
    cost."""
    right = rng.random() < k.p[plan]
    return right, k.right[plan] if right else k.wrong[plan]


def best_run(drawn: list[tuple[Plan, bool, float]], cost: dict[Plan, float]) -> Plan | None:
    """The warm-up as shipped (trainer/warmup.py's `rank_key`, `correct_only`): the plan of the
    best right run by realised reward, then the cheaper, then the earlier; None if none was
    right."""
    right = [(-r, cost[q], i) for i, (q, ok, r) in enumerate(drawn) if ok]
    return drawn[min(right)[2]][0] if right else None


def best_mean(rewards: dict[Plan, list[float]], cost: dict[Plan, float]) -> Plan:
    """The rehearsed warm-up's pick: the plan of the best mean reward over all its runs, then
    the one with more runs (its mean the surer), then the cheaper, then the first sampled."""
    order = list(rewards)
    return min(order, key=lambda q: (-statistics.fmean(rewards[q]), -len(rewards[q]), cost[q],
                                     order.index(q)))


def error(runs: list[float]) -> float:
    """The standard error of a plan's mean reward from its runs; with one run, 0.5 (the
    largest standard deviation a reward in [0, 1] can have: one run says nothing of it)."""
    return statistics.stdev(runs) / len(runs) ** 0.5 if len(runs) > 1 else 0.5


def steps(plan: Plan) -> int:
    return 1 if plan[1] is None else 2


def cheapest_within_error(rewards: dict[Plan, list[float]], cost: dict[Plan, float],
                          c: float = 1.0) -> Plan:
    """`best_mean`'s pick, unless a cheaper plan's mean is within `c` standard errors of the
    best mean (the best plan's error): then the cheapest of those. Among many candidates the
    best of noisy means is often a near tie that costs more (a second step that adds nothing)."""
    best = best_mean(rewards, cost)
    got = rewards[best]
    near = [q for q in rewards
            if statistics.fmean(rewards[q]) >= statistics.fmean(got) - c * error(got)]
    return min(near, key=lambda q: (cost[q], -statistics.fmean(rewards[q])))


def fewer_steps_first(rewards: dict[Plan, list[float]], cost: dict[Plan, float],
                      margin: float | None, c: float = 0.0) -> Plan:
    """The best mean among the plans of fewest steps; a plan of more steps (the best mean
    among its step count) replaces it only if its mean beats it by more than `margin`, or by
    more than `c` of the pair's combined standard error when `margin` is None. A second step
    that adds nothing is a near tie, and the max of many near ties' noisy means beats the
    plain plan's by luck; a second step that matters beats it by far more."""
    by_steps: dict[int, dict[Plan, list[float]]] = {}
    for q, runs in rewards.items():
        by_steps.setdefault(steps(q), {})[q] = runs
    current: Plan | None = None
    for n in sorted(by_steps):
        best = best_mean(by_steps[n], cost)
        if current is None:
            current = best
            continue
        m = margin if margin is not None else c * (error(rewards[best]) ** 2
                                                   + error(rewards[current]) ** 2) ** 0.5
        if statistics.fmean(rewards[best]) > statistics.fmean(rewards[current]) + m:
            current = best
    assert current is not None
    return current


def lower_bound(rewards: dict[Plan, list[float]], cost: dict[Plan, float], c: float) -> Plan:
    """The plan of the best mean - c * standard error (its own runs'), then `best_mean`'s
    order."""
    order = list(rewards)
    return min(order, key=lambda q: (-(statistics.fmean(rewards[q]) - c * error(rewards[q])),
                                     -len(rewards[q]), cost[q], order.index(q)))


TIES = ("mean", "cheaper", "cheaper2", "fewer0.01", "fewer0.02", "fewer0.05", "fewer0.1",
        "fewer1se", "fewer1.5se", "fewer2se", "lcb1", "lcb2")
"""The rules measured by default (`--warmup-tie all`)."""


def tie_rule(name: str) -> Callable[[dict[Plan, list[float]], dict[Plan, float]], Plan]:
    """A rehearsed warm-up's selection rule by name (`--warmup-tie`): `mean`, the best mean;
    `cheaper[C]`, the cheapest plan within C (1) standard errors of the best mean; `fewerM`,
    fewer steps first, a plan of more steps taken only if its mean is better by more than M;
    `fewerCse`, the same by more than C of the pair's combined standard error; `lcbC`, the best
    mean - C standard errors (the plan's own)."""
    try:
        if name == "mean":
            return best_mean
        if name.startswith("cheaper"):
            c = float(name.removeprefix("cheaper") or 1)
            return lambda r, cost: cheapest_within_error(r, cost, c)
        if name.startswith("fewer") and name.endswith("se"):
            c = float(name.removeprefix("fewer").removesuffix("se"))
            return lambda r, cost: fewer_steps_first(r, cost, None, c)
        if name.startswith("fewer"):
            m = float(name.removeprefix("fewer"))
            return lambda r, cost: fewer_steps_first(r, cost, m)
        if name.startswith("lcb"):
            c = float(name.removeprefix("lcb"))
            return lambda r, cost: lower_bound(r, cost, c)
    except ValueError:
        pass
    raise ValueError(f"--warmup-tie: unknown rule {name!r}: mean, cheaper[C], fewerM, "
                     "fewerCse or lcbC (C, M numbers)")


def rehearse(rewards: dict[Plan, list[float]], drawn: list[tuple[Plan, bool, float]],
             rehearsals: int, run_once: Callable[[Plan], float]) -> int:
    """Adds a round's sampled runs to a task's `rewards` (every run of each plan so far) and
    runs each plan not seen in an earlier round `rehearsals` times more; returns how many
    rehearsals it paid for. A plan seen before gains its new samples but no more rehearsals."""
    new = [q for q in dict.fromkeys(q for q, _, _ in drawn) if q not in rewards]
    for q, _, r in drawn:
        rewards.setdefault(q, []).append(r)
    for q in new:
        rewards[q] += [run_once(q) for _ in range(rehearsals)]
    return rehearsals * len(new)


@dataclass
class TaskRuns:
    """What a rehearsed warm-up knows of one task: every run of each plan so far, the plans
    with a right run (the product trains only on a right run), and the plans rehearsed."""

    rewards: dict[Plan, list[float]]
    right: set[Plan]
    rehearsed: set[Plan]


def rehearse_top(task: TaskRuns, drawn: list[tuple[Plan, bool, float]], rehearsals: int,
                 plans: int, cost: dict[Plan, float],
                 run_once: Callable[[Plan], tuple[bool, float]], by: str | None = None) -> int:
    """The product's rehearsal (workflows/train.py, trainer/warmup.py `candidate_plans`): adds
    a round's sampled runs to the task's, then runs the task's `plans` best candidates not
    rehearsed before (plans with a right run, ranked by mean reward, then more runs, then
    cheaper; `by`: in the order the selection rule of that name picks them, one after another)
    `rehearsals` times more each; returns how many rehearsals it paid for."""
    for q, ok, r in drawn:
        task.rewards.setdefault(q, []).append(r)
        if ok:
            task.right.add(q)
    order = list(task.rewards)
    ranked = sorted((q for q in order if q in task.right and q not in task.rehearsed),
                    key=lambda q: (-statistics.fmean(task.rewards[q]), -len(task.rewards[q]),
                                   cost[q], order.index(q)))
    if by is not None:
        left, ranked = {q: task.rewards[q] for q in ranked}, []
        while left and len(ranked) < plans:
            ranked.append(tie_rule(by)(left, cost))
            del left[ranked[-1]]
    for q in ranked[:plans]:
        task.rehearsed.add(q)
        for _ in range(rehearsals):
            ok, r = run_once(q)
            task.rewards[q].append(r)
            if ok:
                task.right.add(q)
    return rehearsals * len(ranked[:plans])


def warm_up(policies: list[Policy], ks: list[Kind], args: argparse.Namespace,
            rng: random.Random, rehearsals: int | None, *, forced: bool = False,
            rounds: int = 1, tie: str = "mean", borrowed: bool = False,
            raced: bool = False) -> tuple[list[tuple[int, int]], float, list[list[TaskRuns]]]:
    """A warm start before GRPO, on `--warmup-tasks` tasks per kind (each the kind's task):
    `--warmup-samples` exploring samples of each, one plan selected per task, then
    `--warmup-steps` Adam steps of cross-entropy on the selected plans' decisions.

    `rehearsals` None: the warm-up as shipped (trainer/warmup.py's `rank_key`): the best single
    right run by realised reward, ties by cost, then the earlier; a task with no right run
    selects nothing. Otherwise each distinct sampled plan is run `rehearsals` times more and
    the plans are ranked by their mean reward over all their runs, then by how many runs
    that mean has, then by cost, then the first sampled (no plan is left out for never being
    right: its mean says so).

    `forced`: of a task's samples, round(`--warmup-force` * samples) are forced to each
    two-step shape (the shape's decisions fixed, the agents drawn as any sample's), the rest
    free. `rounds` > 1: expert iteration; each round samples from the policy the previous
    round's fine-tuning left, rehearses the plans it has not rehearsed yet, ranks every plan
    of every round so far by its mean over all its runs, and fine-tunes on the new selections.
    `borrowed`: from round 2 on, a task's samples also include each plan another task of its
    kind selected in the last round and this task never ran, written as a sample (all its
    decisions forced), so a plan one task found is tried on its siblings.

    `tie`: the rule that selects a task's plan among its ranked ones (TIES). With
    `--warmup-rehearse-plans K` > 0 a round rehearses only each task's K best candidates not
    rehearsed before, among the plans with a right run, and selects among those plans only
    (`rehearse_top`: the product's rule); 0, every plan not seen before.

    Returns per kind how many tasks selected (in the last round) an oracle plan (the oracle's
    or one of equal exact value: the review kind's two drafters swapped) and how many a plan
    of the oracle's shape, the runs per task the warm-up paid for (samples and
    rehearsals), and every run of each task's plans (per kind; a GRPO that credits plan means
    starts from them, as the product's reads the warm-up's stored runs)."""
    runs_paid = 0
    per_shape = round(args.warmup_force * args.warmup_samples) if forced else 0
    targets_of = [SHAPES[1]] * per_shape + [SHAPES[2]] * per_shape
    seen: list[list[TaskRuns]] = [
        [TaskRuns({}, set(), set()) for _ in range(args.warmup_tasks)] for _ in ks]
    oracle_picked: list[tuple[int, int]] = []
    targets: list[list[Plan]] = [[] for _ in ks]
    for _ in range(rounds):
        last, targets = targets, []
        oracle_picked = []
        for pol, k, tasks, before in zip(policies, ks, seen, last, strict=True):
            chosen: list[Plan] = []
            for task in tasks:
                drawn = []
                for i in range(args.warmup_samples):
                    target = targets_of[i] if i < len(targets_of) else None
                    plan, _ = pol.draw(rng, args.warmup_explore, target)
                    drawn.append((plan, *reward_draw(k, plan, rng)))
                if borrowed:
                    for plan in dict.fromkeys(before):
                        if plan not in task.rewards and plan not in (q for q, _, _ in drawn):
                            drawn.append((plan, *reward_draw(k, plan, rng)))
                runs_paid += len(drawn)
                if rehearsals is None:
                    best = best_run(drawn, k.cost)
                    if best is not None:
                        chosen.append(best)
                    continue
                if args.warmup_rehearse_plans:
                    runs_paid += rehearse_top(task, drawn, rehearsals, args.warmup_rehearse_plans,
                                              k.cost, lambda q, k=k: reward_draw(k, q, rng),
                                              tie if args.warmup_rehearse_by_tie else None)
                    if raced:  # the two leading plans run again, however often they ran
                        lead = sorted((q for q in task.rewards if q in task.right),
                                      key=lambda q: -statistics.fmean(task.rewards[q]))[:2]
                        for q in lead:
                            task.rewards[q] += [reward_draw(k, q, rng)[1]
                                                for _ in range(rehearsals)]
                        runs_paid += rehearsals * len(lead)
                    among = {q: r for q, r in task.rewards.items() if q in task.right}
                    if among:
                        chosen.append(tie_rule(tie)(among, k.cost))
                    continue
                runs_paid += rehearse(task.rewards, drawn, rehearsals,
                                      lambda q, k=k: reward_draw(k, q, rng)[1])
                chosen.append(tie_rule(tie)(task.rewards, k.cost))
            targets.append(chosen)
            oracle_picked.append((sum(abs(k.value[q] - k.value[k.oracle]) < 1e-9
                                      for q in chosen),
                                  sum(same_shape(q, k.oracle) for q in chosen)))
        opt = torch.optim.Adam([p for pol in policies for p in pol.parameters()], lr=args.lr)
        for _ in range(args.warmup_steps):
            opt.zero_grad()
            loss = torch.zeros(())
            for pol, chosen in zip(policies, targets, strict=True):
                if chosen:
                    loss = loss - torch.stack([torch.stack(pol.decisions(q)).sum()
                                               for q in chosen]).mean()
            loss.backward()
            opt.step()
    return oracle_picked, runs_paid / (len(ks) * args.warmup_tasks), seen


def plan_means(runs: dict[Plan, list[float]], plans: list[Plan], rewards: list[float]
               ) -> list[float]:
    """A group's credited rewards under `reward = "plan_mean"`: its rollouts' draws added to
    their task's runs, then each rollout credited with its plan's mean over all of them."""
    for plan, r in zip(plans, rewards, strict=True):
        runs.setdefault(plan, []).append(r)
    return [statistics.fmean(runs[plan]) for plan in plans]


def same_shape(plan: Plan, other: Plan) -> bool:
    return (plan[1] is None) == (other[1] is None) and (plan[1] is None or plan[2] == other[2])


def measure(policies: list[Policy] | list[ShapeFirst], ks: list[Kind]
            ) -> tuple[float, float, int, list[Plan]]:
    """The policies' exact expected reward over the oracle's (mean over kinds), their greedy
    plans', how many kinds' greedy plans have the oracle's shape, and each kind's greedy
    plan."""
    fractions, greedy, shaped_right, plans_of = [], [], 0, []
    with torch.no_grad():
        for pol, k in zip(policies, ks, strict=True):
            plans = list(k.value)
            probs = pol.plan_probs(plans)
            fractions.append(sum(float(q) * k.value[p] for q, p in zip(probs, plans, strict=True))
                             / k.value[k.oracle])
            best = plans[int(probs.argmax())]
            greedy.append(k.value[best] / k.value[k.oracle])
            shaped_right += same_shape(best, k.oracle)
            plans_of.append(best)
    return statistics.fmean(fractions), statistics.fmean(greedy), shaped_right, plans_of


@dataclass
class Result:
    e: float
    greedy: float
    shaped_right: int
    # the warm-up's selections: per kind, tasks that picked an oracle plan, its shape
    oracle_picked: list[tuple[int, int]] | None = None
    after_warmup: float | None = None  # E[reward] / oracle right after the warm-up
    warmup_runs: float | None = None  # runs per task the warm-up paid for
    after_shaped: int | None = None  # kinds whose greedy plan has the oracle's shape, then
    greedy_plans: list[Plan] | None = None  # each kind's greedy plan at the end
    after_plans: list[Plan] | None = None  # and right after the warm-up


def run(method: str, names: list[str], ks: list[Kind], args: argparse.Namespace, seed: int
        ) -> Result:
    method, _, tie = method.partition(" [")
    tie = tie.rstrip("]") or ("mean" if args.warmup_tie == "all"
                              else args.warmup_tie.split(",")[0])
    rng = random.Random(seed)
    torch.manual_seed(seed)
    shape_first = method.startswith("shape first: ")
    core = method.removeprefix("shape first: ")
    make = ShapeFirst if shape_first else Policy
    policies = [make(len(names), args.second_step) for _ in ks]
    warm: tuple[list[tuple[int, int]], float, list[list[TaskRuns]]] | None = None
    after: tuple[float, float, int, list[Plan]] | None = None
    if core.startswith("warm-up"):
        how = core.split(" + ", 1)[0]
        rounds = int(how.split(", ")[1].split()[0]) if ", " in how else 1
        warm = warm_up(policies, ks, args, rng,  # type: ignore[arg-type]
                       None if "best run" in how else int(how.split(" of ")[1].split(",")[0]),
                       forced="forced" in how, rounds=rounds, tie=tie,
                       borrowed="borrowed" in how, raced="raced" in how)
        after = measure(policies, ks)
    credit = core.split(" + ", 1)[1] if warm else core  # what GRPO credits after the warm-up
    lr = args.lr if args.grpo_lr is None or not warm else args.grpo_lr
    opt = torch.optim.Adam([p for pol in policies for p in pol.parameters()], lr=lr)
    explore = float(credit.split("explore ")[1].split()[0]) if "explore" in credit else 0.0
    # `by plan mean` ([rollouts] reward = "plan_mean"): each rollout credited with the mean of
    # every run of its task's plan so far (the warm-up's included); the kind's group of an
    # iteration is one of its tasks in turn, as the product picks tasks
    by_plan_mean = credit.endswith(" by plan mean")
    stored = warm[2] if warm else [[TaskRuns({}, set(), set())
                                    for _ in range(args.warmup_tasks)] for _ in ks]
    shape_credit = credit.startswith("shape")
    force = "force" in credit
    g = args.group
    for it in range(args.iterations):
        opt.zero_grad()
        loss = torch.zeros(())
        for pol, k, runs_of in zip(policies, ks, stored, strict=True):
            if credit == "exact":  # the yardstick: the exact gradient of sum pi(p) E[R | p]
                plans = list(k.value)
                loss = loss - (pol.plan_probs(plans) * torch.tensor(
                    [k.value[q] for q in plans])).sum()
                continue
            n_forced, rescue = forced_rollouts(
                args.force, args.anneal or None, it, g) if force else (0, False)
            drawn: list[tuple[Plan, list[bool], bool]] = []
            answered = False
            for sample in range(g):
                target = forced_shape(2, sample, g, n_forced)
                if rescue and answered:
                    target = None
                plan, forced = pol.draw(rng, explore, target)
                right = rng.random() < k.p[plan]
                answered |= right and target is None
                drawn.append((plan, forced, right))
            rewards = [k.right[p] if r else k.wrong[p] for p, _, r in drawn]
            if by_plan_mean:
                rewards = plan_means(runs_of[it % len(runs_of)].rewards,
                                     [plan for plan, _, _ in drawn], rewards)
            if shape_credit:
                shaped, decision_at = [], []
                for (plan, forced, _), r in zip(drawn, rewards, strict=True):
                    rollout, at = pol.shaped(plan, r, any(forced), names)
                    shaped.append(rollout)
                    decision_at.append(at)
                if "by first agent" in credit:  # the means among rollouts of the same draft
                    per_token = [[] for _ in shaped]
                    for a in {plan[0] for plan, _, _ in drawn}:
                        idx = [i for i, (plan, _, _) in enumerate(drawn) if plan[0] == a]
                        sub = shape_advantages([shaped[i] for i in idx], scale=False)
                        for i, row in zip(idx, sub, strict=True):
                            per_token[i] = row
                    mean = statistics.fmean(rewards)
                    advantages = [[r - mean] + [row[i] for i in at[1:]]  # the draft: R - mean
                                  for row, at, r in zip(per_token, decision_at, rewards,
                                                        strict=True)]
                else:
                    per_token = shape_advantages(shaped, scale=False)
                    advantages = [[row[i] for i in at]
                                  for row, at in zip(per_token, decision_at, strict=True)]
            else:
                mean = statistics.fmean(rewards)
                advantages = [[r - mean] * 4 for r in rewards]
            for (plan, forced, _), adv in zip(drawn, advantages, strict=True):
                for lp, f, a in zip(pol.decisions(plan), forced, adv, strict=False):
                    if not f:
                        loss = loss - a * lp / g
        loss.backward()
        opt.step()
    e, greedy, shaped_right, plans_of = measure(policies, ks)
    return Result(e, greedy, shaped_right, warm[0] if warm else None,
                  after[0] if after else None, warm[1] if warm else None,
                  after[2] if after else None, plans_of, after[3] if after else None)


ROWS = {
    "plan order": ("group", "group + explore 0.5", "shape + force",
                   "shape + force + explore 0.5", "shape by first agent + force", "exact"),
    "shape first": ("shape first: group", "shape first: shape", "shape first: shape + force",
                    "shape first: exact"),
    "warm-up": ("warm-up best run + group",
                *(f"warm-up best mean of {r} + group" for r in (4, 8)),
                "shape first: warm-up best mean of 8 + group",
                "warm-up best mean of 8 + shape + force",
                "shape first: warm-up best mean of 8 + shape + force"),
    "candidates": ("warm-up best mean of 8 + group", "warm-up forced best mean of 8 + group",
                   *(f"warm-up{f} best mean of 8, {n} rounds + group"
                     for f in ("", " forced") for n in (2, 3)),
                   "shape first: warm-up forced best mean of 8 + group",
                   "shape first: warm-up forced best mean of 8, 2 rounds + group"),
    "ties": ("warm-up forced best mean of 8, 3 rounds + group",),
    "borrowed": ("warm-up forced best mean of 8, 4 rounds + group",
                 "warm-up forced borrowed best mean of 8, 4 rounds + group",
                 "warm-up forced raced best mean of 8, 4 rounds + group"),
    "plan mean": ("group by plan mean",
                  "warm-up forced best mean of 8, 3 rounds + group + explore 0.25",
                  "warm-up forced best mean of 8, 3 rounds + group + explore 0.25 by plan mean"),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=1, help="the structured pool's seed")
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--runs", type=int, default=8, help="seeds of sampling per method")
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--force", type=float, default=0.5, help="force_shapes")
    p.add_argument("--anneal", type=int, default=10,
                   help="force_shapes_iterations (0: None, the share never falls)")
    p.add_argument("--second-step", type=float, default=0.02,
                   help="the untrained policy's probability of a second step")
    p.add_argument("--rows", default=",".join(ROWS),
                   help=f"which groups of rows, comma-separated, of {', '.join(ROWS)} "
                   "(group, the baseline, always runs)")
    p.add_argument("--warmup-tasks", type=int, default=6,
                   help="tasks per kind the warm-up samples (the structured pools' 24 "
                   "training tasks are 6 a kind)")
    p.add_argument("--warmup-samples", type=int, default=8, help="exploring samples a task")
    p.add_argument("--warmup-explore", type=float, default=0.5)
    p.add_argument("--warmup-tie", default="mean",
                   help="the rehearsed warm-up's selection rules, comma-separated (tie_rule: "
                   "mean, cheaper[C], fewerM, fewerCse, lcbC), or all: "
                   f"{', '.join(TIES)}; every warm-up row runs once per rule")
    p.add_argument("--warmup-rehearse-plans", type=int, default=0,
                   help="rehearse only each task's K best candidates (a right run, by mean) "
                   "not rehearsed before, and select among plans with a right run, as the "
                   "product does; 0: every plan not seen before")
    p.add_argument("--warmup-rehearse-by-tie", action="store_true",
                   help="with --warmup-rehearse-plans, take the K candidates in the order the "
                   "row's selection rule picks them, not by mean")
    p.add_argument("--warmup-force", type=float, default=0.25,
                   help="in a `forced` warm-up, the share of a task's samples forced to each "
                   "two-step shape")
    p.add_argument("--grpo-lr", type=float, default=None,
                   help="GRPO's Adam step size after a warm-up (default: --lr); the shipped "
                   "plans recipe trains GRPO at a tenth of its warm-up's")
    p.add_argument("--warmup-steps", type=int, default=18,
                   help="Adam steps of cross-entropy on the selected plans (at --lr)")
    args = p.parse_args()
    ties = list(TIES) if args.warmup_tie == "all" else [
        t.strip() for t in args.warmup_tie.split(",")]
    for t in ties:
        try:
            tie_rule(t)
        except ValueError as e:
            p.error(str(e))
    names, ks = kinds(args.seed)
    print(f"pool seed {args.seed}: oracle shapes "
          + ", ".join(f"{k.name} {'1 step' if k.oracle[1] is None else '2 steps'}" for k in ks)
          + f"; {len(shapes(2))} shapes; G={args.group}, {args.iterations} iterations, "
          f"{args.runs} runs")
    wanted = list(dict.fromkeys(["group", *(
        m if "warm-up" not in m or len(ties) == 1 else f"{m} [{t}]"
        for r in args.rows.split(",") for m in ROWS[r.strip()]
        for t in (ties if "warm-up" in m and len(ties) > 1 else ties[:1]))]))
    rows: dict[str, list[Result]] = {}
    for method in wanted:
        rows[method] = [run(method, names, ks, args, seed) for seed in range(args.runs)]

    def mean(method: str, field: str) -> float:
        return statistics.fmean(getattr(x, field) for x in rows[method])

    base = (mean("group", "e"), mean("group", "greedy"))
    print(f"{'method':<78} {'E[reward]/oracle':>17} {'greedy/oracle':>14} "
          f"{'kinds shaped right':>19} {'ratio to group (E, greedy)':>27}")
    for method in rows:
        e, gr = mean(method, "e"), mean(method, "greedy")
        print(f"{method:<78} {e:>17.3f} {gr:>14.3f} {mean(method, 'shaped_right'):>17.2f}/4 "
              f"{e / base[0]:>13.2f}x {gr / base[1]:>11.2f}x")
    warmed = [m for m in rows if "warm-up" in m]
    if warmed:
        total = args.warmup_tasks * args.runs
        print(f"\nthe warm-ups ({args.warmup_tasks} tasks a kind, {args.warmup_samples} samples "
              f"a task at epsilon {args.warmup_explore}, {args.warmup_steps} Adam steps; "
              f"{total} selections a kind over all runs): how many selected an oracle plan, "
              "and a plan of the oracle's shape")
        print(f"{'method':<78} {'runs/task':>9} "
              + " ".join(f"{k.name + ' (plan, shape)':>25}" for k in ks)
              + f" {'E after warm-up':>16} {'shaped right then':>18}")
        for m in warmed:
            picked = [[sum(x.oracle_picked[i][j] for x in rows[m])  # type: ignore[index]
                       for j in (0, 1)] for i in range(len(ks))]
            print(f"{m:<78} {mean(m, 'warmup_runs'):>9.1f} "
                  + " ".join(f"{f'{c[0]}, {c[1]}':>25}" for c in picked)
                  + f" {mean(m, 'after_warmup'):>16.3f} {mean(m, 'after_shaped'):>16.2f}/4")
        print(f"\ngreedy plans with the oracle's number of steps, per kind, of {args.runs} runs: "
              "right after the warm-up -> after GRPO; and over the kinds of one step (two "
              "steps), the share whose greedy plan has one step (two)")
        one_step = [i for i, k in enumerate(ks) if steps(k.oracle) == 1]
        print(f"{'method':<78} "
              + " ".join(f"{k.name:>13}" for k in ks)
              + f" {'1-step kinds 1 step':>20} {'2-step kinds 2 steps':>21}")
        for m in warmed:
            def right_steps(field: str, i: int, m: str = m) -> int:
                return sum(steps(getattr(x, field)[i]) == steps(ks[i].oracle) for x in rows[m])

            def share(field: str, kinds_at: list[int], m: str = m) -> float:
                return (sum(right_steps(field, i) for i in kinds_at)
                        / (len(kinds_at) * args.runs))

            two_step = [i for i in range(len(ks)) if i not in one_step]
            per_kind = [f"{right_steps('after_plans', i)} -> {right_steps('greedy_plans', i)}"
                        for i in range(len(ks))]
            ones = (f"{share('after_plans', one_step):.2f} -> "
                    f"{share('greedy_plans', one_step):.2f}")
            twos = (f"{share('after_plans', two_step):.2f} -> "
                    f"{share('greedy_plans', two_step):.2f}")
            print(f"{m:<78} " + " ".join(f"{c:>13}" for c in per_kind)
                  + f" {ones:>20} {twos:>21}")


if __name__ == "__main__":
    main()
