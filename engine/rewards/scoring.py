"""From a finished run to its reward: the paper's scheme (0 invalid plan, 0.5 wrong, 1 correct)
with configurable weights and an optional cost penalty."""

from __future__ import annotations

import math

from conductor_engine.engine.contracts.rewards import Reward, RewardWeights, Verdict
from conductor_engine.engine.rewards.verifiers import verify

RUN_STATUSES = ("completed", "invalid_plan", "failed", "cancelled")


def _penalised(base: float, cost_usd: float, weights: RewardWeights) -> float:
    """Subtract the cost penalty; it lowers a positive reward to 0 at most, so an expensive
    correct answer never scores below an invalid plan (see RewardWeights)."""
    if base <= 0 or weights.cost_penalty_per_usd == 0:
        return base
    cost = cost_usd if math.isfinite(cost_usd) and cost_usd > 0 else 0.0
    return max(0.0, base - weights.cost_penalty_per_usd * cost)


def _completed(verdict: Verdict, weights: RewardWeights) -> tuple[float, str]:
    """Correct → weights.correct; wrong → weights.wrong; partial credit (code: some tests
    passed) lies between the two in proportion to the verdict's score. A verifier error is 0:
    nothing could be checked, so nothing is rewarded."""
    if "error" in verdict.details:
        return 0.0, verdict.reason
    if verdict.correct:
        return weights.correct, f"correct: {verdict.reason}"
    base = weights.wrong + (weights.correct - weights.wrong) * verdict.score
    return base, f"wrong: {verdict.reason}"


def score_run(status: str, answer: str | None, reference: str | None, verifier: str | None,
              *, cost_usd: float = 0.0, weights: RewardWeights | None = None) -> Reward:
    """The reward of one run. A task without a reference is never scored, whatever the status
    (value None: there is nothing to compare groups of rollouts by). Otherwise invalid_plan →
    weights.invalid_plan; failed or cancelled → weights.failed; completed → by the verifier's
    verdict (see `_completed`). The cost penalty applies to every scored run. Never raises."""
    weights = weights or RewardWeights()
    try:
        if reference is None or not reference.strip():
            return Reward(value=None, verdict=None, reason="no reference answer", weights=weights)
        if status == "invalid_plan":
            base, reason, verdict = weights.invalid_plan, "invalid plan", None
        elif status in ("failed", "cancelled"):
            base, reason, verdict = weights.failed, f"run {status}", None
        elif status == "completed":
            verdict = verify(answer, reference, verifier)
            base, reason = _completed(verdict, weights)
        else:
            return Reward(value=None, verdict=None, weights=weights,
                          reason=f"unknown run status {status!r}; "
                                 f"expected one of {', '.join(RUN_STATUSES)}")
        value = _penalised(base, cost_usd, weights)
        if value != base:
            reason += f" (cost penalty {base - value:g} for ${cost_usd:g})"
        return Reward(value=value, verdict=verdict, reason=reason, weights=weights)
    except Exception as exc:  # scoring must never fail a run that already finished
        return Reward(value=0.0, verdict=None, weights=weights,
                      reason=f"verifier error: {type(exc).__name__}: {exc}")
