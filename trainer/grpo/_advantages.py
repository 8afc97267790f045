"""Advantages: how much better than its baseline each rollout scored.

    group   A_i = (r_i - mean(r of its group)) / (std(r of its group) + 1e-4)     GRPO
    batch   A_i = (r_i - mean(r of the update)) / (std(r of the update) + 1e-4)  REINFORCE++

(without the division when not `scale`: Dr. GRPO's unbiased choice). std is the sample standard
deviation (n - 1), as TRL's.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def group_advantages(rewards: Sequence[float], *, scale: bool) -> list[float]:
    """Group-relative advantages A_i = r_i - mean(r), divided by (std(r) + 1e-4) when `scale`.

    std is the sample standard deviation (Bessel's correction, n - 1), as TRL's `nanstd`; a group
    of one has no spread and gets A = 0. `scale=False` is Dr. GRPO's unbiased choice. A group whose
    rewards are all equal gets zeros either way: it carries no learning signal.
    """
    mean = statistics.fmean(rewards)
    centred = [r - mean for r in rewards]
    if not scale:
        return centred
    if len(rewards) < 2:
        return [0.0] * len(rewards)
    std = statistics.stdev(rewards)
    return [a / (std + 1e-4) for a in centred]


def batch_advantages(groups: Sequence[Sequence[float]], *, scale: bool) -> list[list[float]]:
    """Advantages against the whole update's rewards (REINFORCE++'s global baseline), per group:

        A_i = (r_i - mean(r over every rollout of the update)) / (std(r over the same) + 1e-4)

    (without the division when not `scale`). Unlike `group_advantages`, a group whose rollouts
    all scored alike keeps a signal: all failed, its choices are pushed down; all right, up.
    The price is variance between tasks of unequal difficulty, which a group baseline removes.
    """
    flat = [r for g in groups for r in g]
    if len(flat) < 2:
        return [[0.0] * len(g) for g in groups]
    mean = statistics.fmean(flat)
    div = statistics.stdev(flat) + 1e-4 if scale else 1.0
    return [[(r - mean) / div for r in g] for g in groups]
