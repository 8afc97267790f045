"""Credit per shape against the shipped credit, on a tabular policy over a structured pool's plans.

    python tests/benchmarks/bench_shape_credit.py [--seed 1] [--iterations 40] [--runs 8]
        [--group 8] [--second-step 0.02]

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
from dataclasses import dataclass

import torch

from conductor_engine.engine.contracts.plan_shapes import (
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
from conductor_engine.trainer.grpo._shapes import shape_advantages, shaped_rollout

Plan = tuple[int, int | None, bool]  # first agent; second agent (None: one step); sees


@dataclass
class Kind:
    """One task kind: its plans' exact values and the pieces of sim scoring a draw needs."""

    name: str
    p: dict[Plan, float]
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
        table: dict[str, dict[Plan, float]] = {"p": {}, "right": {}, "wrong": {}, "value": {}}
        for a in range(len(names)):
            for b in [None, *range(len(names))]:
                for sees in ((False,) if b is None else (True, False)):
                    steps = [PlanStep(agent=names[a])] + (
                        [] if b is None else [PlanStep(agent=names[b], sees=[0] if sees else [])])
                    value, p, cost = expected_reward(steps, agents, parts, spec.wrong,
                                                     spec.cost_penalty_per_usd)
                    plan = (a, b, sees)
                    table["p"][plan] = p_right(steps, agents, parts)
                    table["right"][plan] = max(0.0, 1.0 - spec.cost_penalty_per_usd * cost)
                    table["wrong"][plan] = max(0.0, spec.wrong - spec.cost_penalty_per_usd * cost)
                    table["value"][plan] = value
        o = oracle.plan
        best: Plan = (names.index(o[0].agent), None if len(o) == 1 else names.index(o[1].agent),
                      len(o) > 1 and bool(o[1].sees))
        out.append(Kind(oracle.kind, table["p"], table["right"], table["wrong"], table["value"],
                        best))
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


def draw(policy: Policy, n: int, rng: random.Random, explore: float,
         force: tuple[str, ...] | None) -> tuple[Plan, list[bool]]:
    """A plan from the policy (each decision uniform with probability `explore`), its shape
    forced to `force`; and which decisions were forced."""
    def pick(logits: torch.Tensor, forced_to: int | None) -> tuple[int, bool]:
        if forced_to is not None:
            return forced_to, True
        if explore and rng.random() < explore:
            return rng.randrange(len(logits)), False
        probs = torch.softmax(logits.detach(), 0).tolist()
        return rng.choices(range(len(probs)), probs)[0], False

    with torch.no_grad():
        a, _ = pick(policy.first, None)
        m, fm = pick(policy.more[a], None if force is None else (0 if force[0] == "more" else 1))
        if m == 1:
            return (a, None, False), [False, fm]
        b, _ = pick(policy.second[a], None)
        s, fs = pick(policy.sees[a, b], None if force is None else (0 if force[1] == "sees" else 1))
        return (a, b, s == 0), [False, fm, False, fs]


def run(method: str, names: list[str], ks: list[Kind], args: argparse.Namespace, seed: int
        ) -> tuple[float, float, int]:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    policies = [Policy(len(names), args.second_step) for _ in ks]
    opt = torch.optim.Adam([p for pol in policies for p in pol.parameters()], lr=args.lr)
    explore = 0.5 if "explore" in method else 0.0
    shape_credit = method.startswith("shape")
    g = args.group
    for it in range(args.iterations):
        opt.zero_grad()
        loss = torch.zeros(())
        for pol, k in zip(policies, ks, strict=True):
            if method == "exact":  # the yardstick: the exact gradient of sum pi(p) E[R | p]
                plans = list(k.value)
                loss = loss - (pol.plan_probs(plans) * torch.tensor(
                    [k.value[q] for q in plans])).sum()
                continue
            n_forced, rescue = forced_rollouts(
                args.force, args.anneal or None, it, g) if shape_credit else (0, False)
            drawn: list[tuple[Plan, list[bool], bool]] = []
            answered = False
            for sample in range(g):
                target = forced_shape(2, sample, g, n_forced)
                if rescue and answered:
                    target = None
                plan, forced = draw(pol, len(names), rng, explore, target)
                right = rng.random() < k.p[plan]
                answered |= right and target is None
                drawn.append((plan, forced, right))
            rewards = [k.right[p] if r else k.wrong[p] for p, _, r in drawn]
            if shape_credit:
                shaped, decision_at = [], []
                for (plan, forced, _), r in zip(drawn, rewards, strict=True):
                    texts, at = pieces(plan, names)
                    shaped.append(shaped_rollout(texts, r, forced=any(forced)))
                    decision_at.append(at)
                if "by first agent" in method:  # the means among rollouts of the same draft
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
    fractions, greedy, shaped_right = [], [], 0
    with torch.no_grad():
        for pol, k in zip(policies, ks, strict=True):
            plans = list(k.value)
            probs = pol.plan_probs(plans)
            fractions.append(sum(float(q) * k.value[p] for q, p in zip(probs, plans, strict=True))
                             / k.value[k.oracle])
            best = plans[int(probs.argmax())]
            greedy.append(k.value[best] / k.value[k.oracle])
            shaped_right += (best[1] is None) == (k.oracle[1] is None) and (
                best[1] is None or best[2] == k.oracle[2])
    return statistics.fmean(fractions), statistics.fmean(greedy), shaped_right


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
    args = p.parse_args()
    names, ks = kinds(args.seed)
    print(f"pool seed {args.seed}: oracle shapes "
          + ", ".join(f"{k.name} {'1 step' if k.oracle[1] is None else '2 steps'}" for k in ks)
          + f"; {len(shapes(2))} shapes; G={args.group}, {args.iterations} iterations, "
          f"{args.runs} runs")
    rows = {}
    for method in ("group", "group + explore 0.5", "shape + force", "shape + force + explore 0.5",
                   "shape by first agent + force", "exact"):
        got = [run(method, names, ks, args, seed) for seed in range(args.runs)]
        rows[method] = (statistics.fmean(x[0] for x in got), statistics.fmean(x[1] for x in got),
                        statistics.fmean(x[2] for x in got))
    base = rows["group"]
    print(f"{'method':<29} {'E[reward]/oracle':>17} {'greedy/oracle':>14} "
          f"{'kinds shaped right':>19} {'ratio to group (E, greedy)':>27}")
    for method, (e, gr, sr) in rows.items():
        print(f"{method:<29} {e:>17.3f} {gr:>14.3f} {sr:>17.2f}/4 "
              f"{e / base[0]:>13.2f}x {gr / base[1]:>11.2f}x")


if __name__ == "__main__":
    main()
