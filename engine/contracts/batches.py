"""A batch's input and progress: what the client sends BatchWorkflow (workflows/batch.py) and
reads back from it (`conductor batch watch`). Both travel in the workflow's history as JSON, so a
field is only ever added with a default: a batch started before it still reads."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, Field

from conductor_engine.engine.contracts.limits import MAX_CONCURRENCY, recorded_concurrency
from conductor_engine.engine.contracts.records import RunResult
from conductor_engine.engine.contracts.task_list_refs import TaskList
from conductor_engine.engine.contracts.tasks import Task


class BatchProgress(BaseModel):
    """What `conductor batch watch` shows; carried across continue-as-new."""

    total: int = 0
    completed: int = 0
    failed: int = 0
    skipped: int = Field(default=0, description="completed by an earlier submission")
    running: int = 0
    scored: int = 0
    reward_sum: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    continued: int = Field(default=0, description="continue-as-new count")
    report_dir: str | None = None
    finished: bool = False

    @property
    def done(self) -> int:
        return self.completed + self.failed + self.skipped

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.scored if self.scored else None

    def add(self, res: RunResult) -> None:
        self.completed += 1
        if res.reward is not None and res.reward.value is not None:
            self.scored += 1
            self.reward_sum += res.reward.value
        self.input_tokens += res.totals.usage.input_tokens
        self.output_tokens += res.totals.usage.output_tokens
        self.cost_usd += res.totals.cost_usd


class BatchInput(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    tasks: list[Task] = Field(
        default_factory=list, description="the tasks inline (older clients; small callers); "
        "used when given, else `task_list`")
    task_list: TaskList | None = Field(
        default=None, description="the tasks in the blob store (what the client sends)")
    concurrency: Annotated[int, BeforeValidator(recorded_concurrency)] = Field(
        default=50, ge=1, le=MAX_CONCURRENCY,
        description="children in flight at once; Temporal allows a workflow 2,000 pending "
        "children (engine/contracts/limits.py)")
    report: bool = True
    children_per_run: int = Field(
        default=500, ge=1, description="continue as new after starting this many children"
    )
    next_index: int = 0
    progress: BatchProgress = Field(default_factory=BatchProgress)
