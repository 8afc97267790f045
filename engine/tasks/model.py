"""A task as a user submits it, and the options of one conductor run."""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import BaseModel, Field

from conductor_engine.engine.plan.language import DEFAULT_MAX_STEPS
from conductor_engine.engine.rewards import RewardWeights


class RunOptions(BaseModel):
    """How one run is conducted. Defaults follow the paper (5 steps, temperature 1.0)."""

    max_steps: int = Field(default=DEFAULT_MAX_STEPS, ge=1, le=20)
    refinement_rounds: int = Field(default=0, ge=0, le=5)
    self_call_depth: int = Field(default=2, ge=0, le=5)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    max_plan_attempts: int = Field(default=3, ge=1, le=20)
    max_step_attempts: int = Field(default=5, ge=1, le=100)
    step_deadline_s: float = Field(
        default=900.0, gt=0, description="all attempts of one step (schedule-to-close)"
    )
    plan_timeout_s: float = Field(default=300.0, gt=0, description="one plan attempt")
    agent_heartbeat_s: float = Field(
        default=15.0, ge=1.0,
        description="agent calls heartbeat this often at most; a cancel reaches them this fast",
    )
    reward: RewardWeights = Field(
        default_factory=RewardWeights, description="how the run is scored (the paper's 0/0.5/1)"
    )
    record_deadline_s: float = Field(
        default=86400.0, gt=0,
        description="how long recording the trace is retried while the trace store is down",
    )
    subtask_max_chars: int = Field(
        default=400, ge=8, le=4000,
        description="longest subtask the conductor may write under constrained decoding",
    )
    policy_version: str | None = Field(
        default=None, pattern=r"^(base|latest|v?[0-9]+)$",
        description="pin the conductor's policy version for this run (training pins each "
        "iteration's rollouts); None follows the pool file",
    )
    sample: int = Field(
        default=0, ge=0,
        description="which rollout of a group this run is; seeds the sim provider",
    )
    result: Literal["full", "summary"] = Field(
        default="full",
        description="what the run returns: the whole RunResult, or its summary (set by the "
        "batch and training workflows on their children: RunResult.summary); self-calls "
        "always return whole",
    )


class VisibleStep(BaseModel):
    """An earlier step as another step (or a self-call's sub-plan) gets to see it."""

    index: int
    agent: str
    subtask: str
    output: str


class Task(BaseModel):
    id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    question: str = Field(min_length=1)
    reference: str | None = Field(default=None, description="the answer (or tests) to score by")
    verifier: str | None = Field(
        default=None, description="exact, choice, math or code; unset = guessed from the reference"
    )
    dataset: str | None = None
    tags: list[str] = Field(default_factory=list)
    batch: str | None = Field(default=None, description="the batch this run belongs to, if any")
    options: RunOptions = Field(default_factory=RunOptions)
    context: list[VisibleStep] = Field(
        default_factory=list, description="what a self-call's parent step could see"
    )
    depth: int = Field(default=0, ge=0, description="0 for a user's task, +1 per self-call")
