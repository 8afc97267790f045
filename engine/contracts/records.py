"""What a run returns: plan attempts, step records, rounds and totals.

These are the workflow's result (and, later, the raw material of a trace), so they are plain
pydantic models that pass through Temporal's data converter unchanged.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from conductor_engine.engine.plan.language import Access, Plan
from conductor_engine.engine.providers.base import Citation, Message, Usage
from conductor_engine.engine.rewards import Reward


class PlanAttempt(BaseModel):
    """One call of the conductor for a plan: its raw text and either the plan or the error."""

    attempt: int
    raw_text: str
    plan: Plan | None = None
    error: str | None = None
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float = 0.0
    seconds: float = 0.0
    conductor_id: str = ""
    policy_version: str = ""
    prompt: list[Message] = Field(
        default_factory=list, description="the conductor's input, for the trainer to re-score"
    )
    finish_reason: str | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    forced_positions: list[int] | None = Field(
        default=None, description="indices into token_ids the plan grammar forced"
    )
    agent_timeouts: dict[str, float] = Field(
        default_factory=dict, description="start-to-close of each agent, from the worker's pool"
    )


class AgentReply(BaseModel):
    """What one agent call returned (the activity's result)."""

    output: str
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float = 0.0
    model: str = ""
    seconds: float = 0.0
    attempt: int = 1
    citations: list[Citation] = Field(
        default_factory=list, description="web sources the agent cited (agents with web_search)"
    )


class StepRecord(BaseModel):
    round: int
    index: int
    agent: str
    subtask: str
    access: Access
    saw: list[int] = Field(default_factory=list)
    status: Literal["pending", "running", "done", "failed"] = "pending"
    output: str = ""
    model: str = ""
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float = 0.0
    seconds: float = 0.0
    attempts: int = 0
    error: str | None = None
    child_workflow_id: str | None = None
    citations: list[Citation] = Field(
        default_factory=list, description="web sources the agent cited (agents with web_search)"
    )


class RoundRecord(BaseModel):
    index: int
    attempts: list[PlanAttempt] = Field(default_factory=list)
    plan: Plan | None = None
    steps: list[StepRecord] = Field(default_factory=list)
    answer: str | None = None


class Totals(BaseModel):
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float = 0.0
    agent_calls: int = 0
    plan_calls: int = 0
    seconds: float = 0.0


RunStatus = Literal["completed", "invalid_plan", "failed", "cancelled"]


class RunResult(BaseModel):
    task_id: str
    workflow_id: str = ""
    run_id: str = ""
    status: RunStatus = "completed"
    answer: str | None = None
    error: str | None = None
    failure: str | None = Field(
        default=None, description="the type of the error that ended a failed run: StepFailed "
        "(an agent exhausted its retries) or PlanFailed (the conductor could not be called)")
    rounds: list[RoundRecord] = Field(default_factory=list)
    totals: Totals = Field(default_factory=Totals)
    reward: Reward | None = None

    @property
    def plans(self) -> list[Plan]:
        return [r.plan for r in self.rounds if r.plan is not None]

    @property
    def steps(self) -> list[StepRecord]:
        return [s for r in self.rounds for s in r.steps]
