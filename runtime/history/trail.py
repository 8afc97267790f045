"""The audit trail's data: what a run's history says each round, plan attempt and step did."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from conductor_engine.engine.contracts.agent_calls import Usage
from conductor_engine.engine.contracts.plans import Access, Plan
from conductor_engine.engine.contracts.rewards import Reward
from conductor_engine.engine.contracts.tasks import SeenStep, Task

ExecutionStatus = Literal[
    "running", "completed", "failed", "cancelled", "terminated", "timed_out", "continued_as_new"
]
StepStatus = Literal["pending", "running", "done", "failed", "cancelled"]


class HistoryError(RuntimeError):
    """A run's history cannot be read (no such run, or a payload that cannot be decoded)."""


# --- the trail ------------------------------------------------------------------------------


class AttemptError(BaseModel):
    """How one attempt of an activity (or a self-call child) failed."""

    attempt: int | None = Field(description="the attempt number, None where history omits it")
    message: str
    type: str | None = Field(default=None, description="the error's type, or the timeout kind")
    non_retryable: bool = False


class TrailStep(BaseModel):
    round: int
    index: int = Field(description="0-based, as in plans and traces")
    agent: str
    subtask: str
    question: str = Field(default="", description="the task's question, as the agent got it")
    access: Access | None = None
    sees: list[int] = Field(default_factory=list)
    seen: list[SeenStep] = Field(
        default_factory=list, description="the earlier steps the agent was shown, with outputs"
    )
    status: StepStatus = "pending"
    output: str | None = None
    model: str = ""
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float = 0.0
    seconds: float = Field(default=0.0, description="scheduled to closed, all attempts")
    attempts: int = 0
    errors: list[AttemptError] = Field(default_factory=list)
    child_workflow_id: str | None = None
    scheduled_event_id: int | None = None
    scheduled_by_event_id: int | None = Field(
        default=None, description="the WorkflowTaskCompleted event whose commands scheduled it"
    )
    started_event_id: int | None = None
    closed_event_id: int | None = None

    @property
    def number(self) -> str:
        return f"{self.index + 1}"


class TrailPlanAttempt(BaseModel):
    round: int
    attempt: int
    status: StepStatus = "running"
    raw_text: str | None = None
    plan: Plan | None = None
    error: str | None = Field(default=None, description="why the plan was rejected")
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float = 0.0
    conductor_id: str = ""
    policy_version: str = ""
    attempts: int = Field(default=0, description="activity attempts (calls of the conductor)")
    errors: list[AttemptError] = Field(default_factory=list)
    scheduled_event_id: int | None = None
    scheduled_by_event_id: int | None = None
    started_event_id: int | None = None
    closed_event_id: int | None = None


class TrailRound(BaseModel):
    index: int
    plan_attempts: list[TrailPlanAttempt] = Field(default_factory=list)
    plan: Plan | None = None
    steps: list[TrailStep] = Field(default_factory=list)


class ResetRecord(BaseModel):
    """This run began as a reset of another run (a resume)."""

    base_run_id: str
    event_id: int = Field(description="the WorkflowTaskFailed event that marks the reset")
    reason: str


class Trail(BaseModel):
    """Everything history says about one run, step by step."""

    workflow_id: str
    run_id: str
    status: ExecutionStatus
    task: Task | None = None
    run_status: str | None = Field(
        default=None, description="the engine's status: completed, invalid_plan, failed, ..."
    )
    answer: str | None = None
    error: str | None = None
    reward: Reward | None = None
    rounds: list[TrailRound] = Field(default_factory=list)
    self_calls: list[str] = Field(default_factory=list, description="child workflow ids")
    reset: ResetRecord | None = None
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float = 0.0
    started_at: datetime | None = None
    closed_at: datetime | None = None
    events: int = 0

    @property
    def steps(self) -> list[TrailStep]:
        return [s for r in self.rounds for s in r.steps]

    @property
    def plan_attempts(self) -> list[TrailPlanAttempt]:
        return [a for r in self.rounds for a in r.plan_attempts]
