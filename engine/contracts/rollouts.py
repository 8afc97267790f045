"""Which finished runs are honest GRPO rollouts, and why the others are left out.

GRPO compares the runs of one group with each other, so a run may only enter its group when its
reward says something about the plan the policy wrote. A malformed plan does (it scores the
recipe's `invalid_plan`, 0 in the paper); an infrastructure failure does not: a provider that
kept answering 500, a conductor that could not be reached, a verifier that crashed, a reward that
was never computed. Scoring those 0 would teach the policy that whatever it wrote was wrong, so
they are left out of their group and counted by reason instead (DESIGN.md, "Trust").

Pure functions over pydantic data: the training workflow (on a RunResult) and the trainer (on a
stored trace) classify a run the same way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Literal

from conductor_engine.engine.rewards import Reward

LeftOutReason = Literal[
    "step_failed",     # a step's agent exhausted its retries (or its self-call failed)
    "plan_failed",     # the conductor itself could not be called
    "run_failed",      # failed for another reason, or a trace that did not record which
    "cancelled",       # someone cancelled the run
    "verifier_error",  # the verifier failed: nothing was checked
    "untrusted",       # a verdict the candidate could have forged (assert-style code tests)
    "no_reward",       # no reward value: no reference, or the score activity failed
    "plan_retried",    # a stored run whose refinement round needed several plan attempts
    "unreadable",      # the stored trace could not be read (missing blob, invalid document)
    "grammar_rejected",  # a served plan's token ids break the plan grammar (trainer/replay.py)
    "too_few_left",    # a usable run whose group kept fewer than MIN_GROUP runs
]

MIN_GROUP = 2
"""The fewest usable runs that still form a group: one run has no one to be compared with."""

FAILURE_REASONS: dict[str, LeftOutReason] = {
    "StepFailed": "step_failed",
    "PlanFailed": "plan_failed",
}
"""The ConductWorkflow's error types (RunResult.failure) → the reason its run is left out."""


def failure_reason(failure: str | None) -> LeftOutReason:
    """Why a failed run is left out, from the type of the error that ended it."""
    return FAILURE_REASONS.get(failure or "", "run_failed")


def verifier_failed(reward: Reward) -> bool:
    """Whether the verifier failed rather than judged: the verdict's details carry "error",
    or the scorer itself caught an exception (reason "verifier error: ...")."""
    verdict = reward.verdict
    return (verdict is not None and "error" in verdict.details) or \
        reward.reason.startswith("verifier error")


def left_out_reason(status: str, reward: Reward | None,
                    failure: str | None = None) -> LeftOutReason | None:
    """Why a finished run cannot be a rollout, or None when its reward is an honest one.

    `invalid_plan` is the policy's own doing and stays in (with its `invalid_plan` reward);
    a failed or cancelled run, a missing reward, a verifier failure and a verdict the candidate
    could have forged (`code_tests.UNTRUSTED`) are not."""
    if status == "failed":
        return failure_reason(failure)
    if status == "cancelled":
        return "cancelled"
    if reward is None or reward.value is None:
        return "no_reward"
    if verifier_failed(reward):
        return "verifier_error"
    if reward.verdict is not None and reward.verdict.untrusted:
        return "untrusted"
    return None


def count_reasons(reasons: Iterable[str]) -> dict[str, int]:
    """Counts by reason, most frequent first (ties by name), for stats and their display."""
    counts = Counter(reasons)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def merge_counts(*counts: dict[str, int]) -> dict[str, int]:
    """Several counts by reason added up, in `count_reasons` order."""
    total: Counter[str] = Counter()
    for c in counts:
        total.update(c)
    return dict(sorted(total.items(), key=lambda kv: (-kv[1], kv[0])))


def describe_counts(counts: dict[str, int]) -> str:
    """"5 (verifier_error 4, step_failed 1)", or "0"."""
    total = sum(counts.values())
    if not total:
        return "0"
    return f"{total} ({', '.join(f'{k} {v}' for k, v in counts.items())})"
