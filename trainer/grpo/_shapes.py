"""Credit per shape: each decision of a plan measured against rollouts of the same shape.

A plan's shape (engine/contracts/plan_shapes.py) is decided by a few of its tokens: the `,` or `]`
after
each step, and whether a later step's access list sees anything. With one baseline per task, a
`,` that opened a second step is blamed for every wrong agent put in that step, and is unlearned
before the agents inside the step can be. Here, for one task's group, with b(p) the mean reward
of the group's rollouts whose shape begins with the outcomes p (b(()) the task's mean):

    a shape token of outcome k (unforced rollout)    A = b(s) - b(s_1..s_k-1)
    any other token of an unforced rollout           A = R - b(s_1..s_j)
                                                       (j: the outcomes decided before it)
    any sampled token of a rollout forced to s       A = R - b(s)
    any token of a rollout alone in its shape s      A = R - b(())   (the group credit)

divided by the group's reward std when `scale`. A token's baseline is the mean of the rollouts
that agree with it on what was fixed when it was sampled: in a forced rollout the whole shape
(forcing is drawn before the rollout starts), in an unforced one the outcomes already written.
So every baseline is a function of the token's history, and only the shape tokens' credit is
not the rollout's own: their return R is replaced by the mean of the rollout's whole shape s,
which pools the evidence of every rollout of that shape (forced ones included) into the
decisions that chose it. (Averaged over how the policy goes on, b(s) is the policy's own value
of the outcome: the `,` of a rollout that then saw the first step is credited with the
draft-and-review plans' mean, one that then did not with the two-apart plans'.)

In expectation, with the group means replaced by their limits (group size to infinity), a share
rho of rollouts forced, each of the K shapes alike, and the rest on-policy:

    E[g] = (1 - rho) * (grad J + Delta) + rho / K * sum_s grad_in J_s

    J      = sum over plans p of pi(p) R(p)                         (the objective)
    J_s    = the same with shape s's tokens forced: its sampled tokens from pi (a choice narrowed
             to the tokens consistent with s, renormalised over them), its forced ones fixed;
             grad_in differentiates the sampled tokens only
    Delta  = E_pi[ sum over shape tokens t of grad log pi(a_t | h_t) * (b(s) - R) ]

Delta is the price of pooling: zero when the expected reward of each shape does not depend on
the decisions made before its tokens (the first step's agent), not in general.
tests/unit/trainer/test_grpo_shapes.py checks this identity by enumeration on a tiny policy, and
that
without Delta the estimator is off. Forced tokens stay out of the loss, and a narrowed choice is
scored over the tokens it was drawn from, so the importance ratios are exact for what was
sampled. With finite groups the means include the rollout itself: GRPO's O(1/n) bias.

That inclusion is why a rollout alone in its shape in its group takes the group credit: b(s)
would be its own reward, so every token measured against it (all of a forced rollout's) would
be credited zero, and a forced rollout, usually the only one of its shape at G = 4..8, would
teach nothing. Against the task's mean instead, a forced rollout's expected gradient is exact
up to a scale at any group size: with n_s the group's rollouts of its shape (itself included),
its tokens' credit is (n_s - 1) / n_s * (R - the others' mean of s) when n_s >= 2 and
(G - 1) / G * (R - the other rollouts' mean) when alone, each baseline independent of the
rollout, so

    E[g_forced to s] = E[c] * grad_in J_s,   c = (n_s - 1) / n_s if n_s >= 2 else (G - 1) / G

which tests/unit/trainer/test_grpo_shapes.py checks by enumerating every group of a tiny
problem. (Lone-ness is a count of rollouts, whatever their `weights`.)
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from conductor_engine.engine.contracts.plan_shapes import Shape, decided


@dataclass
class ShapedRollout:
    """One rollout of a group as the shape credit sees it.

    `level[t]`: how many of its shape outcomes were decided before completion token t;
    `owner[t]`: the index of the outcome token t helped decide, or None for any other token.
    A rollout whose plan did not finish (no shape) has `shape` () and every level 0."""

    reward: float
    shape: Shape
    level: list[int]
    owner: list[int | None]
    forced: bool = False


def shaped_rollout(token_texts: Sequence[str], reward: float, *, forced: bool = False
                   ) -> ShapedRollout:
    """A rollout from its completion's token texts (each token decoded alone): where each of
    its plan's shape outcomes was decided. Only a complete shape (one that ends) counts; an
    unfinished plan is shapeless, its tokens measured against the task's mean."""
    starts, at = [], 0
    for piece in token_texts:
        starts.append(at)
        at += len(piece)
    found = decided("".join(token_texts))
    if not found or found[-1].outcome != "end":
        n = len(token_texts)
        return ShapedRollout(reward, (), [0] * n, [None] * n, forced)

    def token_at(char: int) -> int:
        lo, hi = 0, len(starts) - 1
        while lo < hi:  # the last token starting at or before `char`
            mid = (lo + hi + 1) // 2
            if starts[mid] <= char:
                lo = mid
            else:
                hi = mid - 1
        return lo

    owner: list[int | None] = [None] * len(token_texts)
    level = [0] * len(token_texts)
    for k, d in enumerate(found):
        first, last = token_at(d.start), token_at(d.at)
        for t in range(first, last + 1):
            owner[t] = k
        for t in range(last + 1, len(token_texts)):
            level[t] = k + 1
    return ShapedRollout(reward, tuple(d.outcome for d in found), level, owner, forced)


def shape_advantages(rollouts: Sequence[ShapedRollout], *, scale: bool,
                     weights: Sequence[float] | None = None) -> list[list[float]]:
    """Per completion token of each rollout, its advantage (see the module docstring).

    `weights` (default 1 each) weigh the rollouts in the means: a probability per possible
    rollout gives the means' limits, as the brute-force test needs."""
    w = list(weights) if weights is not None else [1.0] * len(rollouts)
    means: dict[Shape, float] = {}
    count: dict[Shape, int] = {}
    for r in rollouts:
        count[r.shape] = count.get(r.shape, 0) + 1

    def b(prefix: Shape) -> float:
        if prefix not in means:
            num = den = 0.0
            for r, wr in zip(rollouts, w, strict=True):
                if r.shape[: len(prefix)] == prefix:
                    num += wr * r.reward
                    den += wr
            means[prefix] = num / den if den else 0.0
        return means[prefix]

    div = 1.0
    if scale:
        if len(rollouts) < 2:
            return [[0.0] * len(r.level) for r in rollouts]
        div = statistics.stdev([r.reward for r in rollouts]) + 1e-4
    out = []
    for r in rollouts:
        row = []
        alone = count[r.shape] < 2  # b(s) would be R itself: the group credit instead
        for lv, own in zip(r.level, r.owner, strict=True):
            if alone:
                a = r.reward - b(())
            elif r.forced:
                a = r.reward - b(r.shape)
            elif own is not None:
                a = b(r.shape) - b(r.shape[:own])
            else:
                a = r.reward - b(r.shape[:lv])
            row.append(a / div)
        out.append(row)
    return out
