"""Rewards: verifiers that judge an answer against a task's reference, and the scheme that turns
a run's outcome into the reward a trainer learns from (the paper's 0 / 0.5 / 1 by default)."""

from conductor_engine.engine.rewards.scoring import RUN_STATUSES, score_run
from conductor_engine.engine.rewards.verifiers import VERIFIERS, detect_verifier, verify

__all__ = [
    "RUN_STATUSES",
    "VERIFIERS",
    "detect_verifier",
    "score_run",
    "verify",
]
