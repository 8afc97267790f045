"""The activities' inputs: what a workflow sends an activity, and what the audit trail decodes
again from a run's history.

They live here, below both, so that the runtime reads a history without importing the
activities. Their results are records (engine/contracts/records.py: PlanAttempt, AgentReply),
the Reward (engine/rewards) and the training update's (engine/contracts/training.py).
Histories hold these models as JSON: a field may be added with a default, never renamed or
removed, or recorded runs no longer decode.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import AliasChoices, BaseModel, Field

from conductor_engine.engine.contracts.agent_calls import TaskInfo
from conductor_engine.engine.contracts.plans import Plan
from conductor_engine.engine.contracts.records import RunResult, RunStatus
from conductor_engine.engine.contracts.rewards import RewardWeights
from conductor_engine.engine.contracts.tasks import SeenStep, Task


class PreviousRound(BaseModel):
    """A refinement round's view of an earlier round: its plan and the answer it gave."""

    plan: Plan
    answer: str


class PlanRequest(BaseModel):
    """`write_plan`: one attempt at the plan of one round."""

    task: Task
    round: int = 0
    attempt: int = 1
    previous: list[PreviousRound] = Field(default_factory=list)
    last_error: str | None = None

    @property
    def allow_empty(self) -> bool:
        return bool(self.previous)  # in a refinement round, an empty plan keeps the answer


class AgentCallInput(BaseModel):
    """`call_agent`: one step, as its agent is asked it."""

    agent: str
    question: str
    subtask: str
    seen: list[SeenStep] = Field(
        default_factory=list, validation_alias=AliasChoices("seen", "visible"),
        description="the earlier steps the step sees; read as `visible` too, the name in "
        "histories written before",
    )
    round: int = 0
    index: int = 0
    task: TaskInfo | None = Field(
        default=None,
        description="the task and rollout (sim agents answer by it; the activity sets attempt); "
        "None in histories from before it existed",
    )
    outer_question: str | None = Field(
        default=None,
        description="in a self-call's sub-plan: the question of the whole job (Task."
        "frame.outer_question), so the agent answers its part knowing the whole",
    )
    background: list[SeenStep] = Field(
        default_factory=list,
        description="in a self-call's sub-plan: what the parent step could see (Task.context), "
        "granted to a step whose access is \"all\"",
    )


class ScoreRequest(BaseModel):
    """`score_run`: a run's outcome against the task's reference."""

    status: RunStatus
    answer: str | None = None
    reference: str | None = None
    verifier: str | None = None
    cost_usd: float = 0.0
    weights: RewardWeights = RewardWeights()


class RecordRequest(BaseModel):
    """`record_trace`: what the workflow knows at the end of a run."""

    task: Task
    result: RunResult
    started_at: datetime
    finished_at: datetime
    parent_workflow_id: str | None = None
