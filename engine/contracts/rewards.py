"""The data of scoring: the weights that turn an outcome into a reward, a verifier's verdict on one
answer, and the reward recorded with a trace. Pure pydantic models so they cross the Temporal data
converter and live in traces unchanged."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class RewardWeights(BaseModel):
    """The reward of each outcome. Defaults are the paper's scheme: 0 for a plan that could not be
    parsed, 0.5 for a well-formed plan whose answer is wrong, 1 for a correct answer.

    The cost penalty (off by default) is subtracted per US dollar the run spent; it can lower a
    positive reward to 0 but never below, so a costly correct answer never scores under an
    invalid plan. Rewards that start at or below 0 are left as they are."""

    invalid_plan: float = 0.0
    failed: float = Field(default=0.0, description="a step exhausted its retries, or cancelled")
    wrong: float = 0.5
    correct: float = 1.0
    cost_penalty_per_usd: float = Field(default=0.0, ge=0.0)

    def rule(self) -> str:
        """The scheme in a few words, for beside a verdict: `1 right · 0.5 wrong · 0 no valid
        plan` (and what a failed run scores when that differs)."""
        parts = [f"{self.correct:g} right", f"{self.wrong:g} wrong",
                 f"{self.invalid_plan:g} no valid plan"]
        if self.failed != self.invalid_plan:
            parts.append(f"{self.failed:g} failed run")
        if self.cost_penalty_per_usd:
            parts.append(f"-{self.cost_penalty_per_usd:g} per $")
        return " · ".join(parts)


class Verdict(BaseModel):
    """What a verifier concluded about one answer."""

    verifier: str = Field(description='"exact" | "choice" | "math" | "code" | "none"')
    correct: bool | None = Field(description="None when there is no reference to check against")
    score: float = Field(ge=0.0, le=1.0, description="code: the fraction of tests passed")
    reason: str = Field(description='human-readable, e.g. "expected 42, got 41"')
    details: dict[str, Any] = Field(
        default_factory=dict,
        description='extracted answer, normalised forms, test output; "error" marks a verifier '
        'failure (as opposed to a wrong answer); "trusted": false a verdict the candidate could '
        "have forged (assert-style code tests)",
    )

    @property
    def untrusted(self) -> bool:
        """Whether the candidate could have forged this verdict (`code_tests.UNTRUSTED`):
        training leaves it out, eval and batch reports count it apart, never as correct."""
        return self.details.get("trusted") is False


class Reward(BaseModel):
    """The reward of one run, with the verdict it came from and the weights used."""

    value: float | None = Field(description="None when there is no reference (nothing to score)")
    verdict: Verdict | None = None
    reason: str
    weights: RewardWeights = Field(default_factory=RewardWeights)

    def __str__(self) -> str:
        """`1 (correct: equals 5)`: the number and its verdict, as `print(result.reward)` shows
        it (the fields stay as they are, so stored traces read back unchanged)."""
        value = "none" if self.value is None else f"{self.value:g}"
        return f"{value} ({self.reason})"

    def __float__(self) -> float:
        """The value, for arithmetic; a run with no reference has none to give."""
        if self.value is None:
            raise ValueError(f"no reward value: {self.reason}")
        return self.value
