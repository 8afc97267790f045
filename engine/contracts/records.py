"""What a run returns: plan attempts, step records, rounds and totals.

These are the workflow's result (and, later, the raw material of a trace), so they are plain
pydantic models that pass through Temporal's data converter unchanged. A run started by a batch
or a training run returns only its summary (`RunResult.summary`): the parent's history keeps
every child's result, and the whole run is in its trace.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, Field, field_serializer, field_validator

from conductor_engine.engine.contracts.agent_calls import Citation, Message, Usage
from conductor_engine.engine.contracts.limits import CHILD_SUMMARY_TEXT_CHARS
from conductor_engine.engine.contracts.plans import Access, Plan
from conductor_engine.engine.contracts.rewards import Reward
from conductor_engine.engine.contracts.strict import revised


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
    choice_tokens: dict[int, list[int]] | None = Field(
        default=None, description="index into token_ids -> the few tokens the plan grammar "
        "allowed there; logprobs at those indices are over them (see Completion)",
    )
    json_schema: dict[str, Any] | None = Field(
        default=None, description="the plan grammar's JSON schema, kept when the backend "
        "returned token ids but not the grammar's records, or when a shape was forced: the "
        "trainer reconstructs the grammar's records from it "
        "(engine/providers/local/reconstruct.py)",
    )
    forced_shape: str | None = Field(
        default=None, description="the shape the sampler was asked to write (a training "
        "rollout's or warm-up sample's force_shapes): the tokens that decided it are in "
        "forced_positions, right for GRPO's importance weights; a warm-up that learns the plan "
        "rebuilds the plain grammar's records, so that it learns the shape's decisions too",
    )
    forced_agent: str | None = Field(
        default=None, description="the first step's agent the sampler was asked to write (a "
        "warm-up sample's force_agents): rebuilt by the warm-up like forced_shape, so that it "
        "learns the agent it was made to try when that plan scored best",
    )
    agent_timeouts: dict[str, float] = Field(
        default_factory=dict, description="start-to-close of each agent, from the worker's pool"
    )

    @field_serializer("json_schema", when_used="json")
    def _schema_as_text(self, schema: dict[str, Any] | None) -> str | None:
        """The schema as JSON text: a trace is a jsonb document, and jsonb reorders object keys
        (shortest first), while the grammar writes properties in the schema's order. Stored as
        an object, reconstruction would expect `steps` before `reasoning`, and reject every plan."""
        return None if schema is None else json.dumps(schema)

    @field_validator("json_schema", mode="before")
    @classmethod
    def _schema_from_text(cls, value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value


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
    sees: list[int] = Field(
        default_factory=list, validation_alias=AliasChoices("sees", "saw"),
        description="the earlier steps it was shown; read as `saw` too, the name in traces and "
        "histories written before",
    )
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
    summarized: bool = Field(
        default=False, description="a summary (`summary()`): no rounds, the answer and other "
        "texts cut short; the whole run is in its trace and in its record activity's input")

    def summary(self) -> RunResult:
        """What a batch or training child returns to its parent: status, failure, totals, the
        reward (long texts cut, verdict details kept by key), the start of the answer and the
        error; no rounds. A few KB however long the run's prompts and outputs, so a parent's
        history grows by a few KB per child (engine/contracts/limits.py). Its parent reads the
        rest from the trace store; `ConductorClient.result` gives the whole run back."""
        n = CHILD_SUMMARY_TEXT_CHARS
        return RunResult(
            task_id=self.task_id, workflow_id=self.workflow_id, run_id=self.run_id,
            status=self.status, answer=_cut(self.answer, n), error=_cut(self.error, n),
            failure=self.failure, totals=self.totals,
            reward=_small_reward(self.reward, n), summarized=True,
        )

    @property
    def plans(self) -> list[Plan]:
        return [r.plan for r in self.rounds if r.plan is not None]

    @property
    def steps(self) -> list[StepRecord]:
        return [s for r in self.rounds for s in r.steps]


def _cut(text: str | None, limit: int) -> str | None:
    """At most `limit` characters of `text`, an ellipsis marking a cut."""
    if text is None or len(text) <= limit:
        return text
    return text[: limit - 1] + "…"


_MAX_DETAILS = 16


def _small_reward(reward: Reward | None, limit: int) -> Reward | None:
    """The reward with its reasons cut and each verdict detail made short: numbers, booleans
    and None as they are, anything else as at most `limit` characters of text. Every key is
    kept (up to 16): whether a verdict holds "error", or "trusted": false, decides whether a
    training run keeps the rollout (engine/rewards/rollouts.py)."""
    if reward is None:
        return None
    verdict = reward.verdict
    if verdict is not None:
        details = {k: _small_value(v, limit)
                   for k, v in list(verdict.details.items())[:_MAX_DETAILS]}
        verdict = revised(verdict, reason=_cut(verdict.reason, limit) or "", details=details)
    return revised(reward, reason=_cut(reward.reason, limit) or "", verdict=verdict)


def _small_value(value: Any, limit: int) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return _cut(text, limit)
