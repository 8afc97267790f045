"""The trace: the full, versioned record of one finished run.

A trace is what the trainer learns from (each root trace a GRPO rollout, as
engine/rewards/rollouts.py decides) and what analysts query. It is built from the workflow's
RunResult by the record activity, so the workflow stays small and the trace's shape can grow
without touching workflow code.

Schema versions: bump TRACE_SCHEMA_VERSION when a field changes meaning or is removed (adding an
optional field does not need a bump). Readers upgrade old documents in `Trace.from_document`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from conductor_engine.engine.contracts.policy_versions import BASE
from conductor_engine.engine.contracts.records import RoundRecord, RunResult, StepRecord, Totals
from conductor_engine.engine.contracts.rewards import Reward
from conductor_engine.engine.contracts.tasks import Task

TRACE_SCHEMA_VERSION = 1

TraceStatus = Literal["completed", "invalid_plan", "failed", "cancelled"]


class PolicyRef(BaseModel):
    """Which conductor wrote the plans: its pool id and weights version."""

    name: str
    version: str = Field(default=BASE, description="the version's label: \"base\", \"v3\"")


class Trace(BaseModel):
    schema_version: int = TRACE_SCHEMA_VERSION
    workflow_id: str
    run_id: str
    parent_workflow_id: str | None = Field(
        default=None, description="set on a self-call's trace: the run whose step it answered"
    )
    depth: int = 0
    task: Task
    policy: PolicyRef
    status: TraceStatus
    answer: str | None = None
    error: str | None = None
    failure: str | None = Field(
        default=None, description="a failed run's error type (StepFailed, PlanFailed)")
    reward: Reward | None = None
    rounds: list[RoundRecord] = Field(default_factory=list)
    totals: Totals = Field(default_factory=Totals)
    started_at: datetime
    finished_at: datetime
    children: list[Trace] = Field(
        default_factory=list,
        description="self-call traces, filled in when read back (stored as their own rows)",
    )

    @property
    def steps(self) -> list[StepRecord]:
        return [s for r in self.rounds for s in r.steps]

    @property
    def child_workflow_ids(self) -> list[str]:
        return [s.child_workflow_id for s in self.steps if s.child_workflow_id]

    @property
    def valid_plan(self) -> bool:
        return any(r.plan is not None for r in self.rounds)

    def document(self) -> dict[str, Any]:
        """The JSON document stored in PostgreSQL (children live in their own rows)."""
        return self.model_dump(mode="json", exclude={"children"})

    def document_json(self) -> bytes:
        """The same document, serialised (by pydantic's fast path)."""
        return self.model_dump_json(exclude={"children"}).encode()

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> Trace:
        version = doc.get("schema_version", 1)
        if version > TRACE_SCHEMA_VERSION:
            raise ValueError(
                f"trace schema version {version} is newer than this engine's "
                f"({TRACE_SCHEMA_VERSION}); upgrade conductor-engine to read it"
            )
        return cls.model_validate(doc)

    @classmethod
    def from_run(
        cls,
        task: Task,
        result: RunResult,
        *,
        policy: PolicyRef,
        started_at: datetime,
        finished_at: datetime,
        reward: Reward | None = None,
        parent_workflow_id: str | None = None,
    ) -> Trace:
        return cls(
            workflow_id=result.workflow_id, run_id=result.run_id,
            parent_workflow_id=parent_workflow_id, depth=task.frame.depth, task=task, policy=policy,
            status=result.status, answer=result.answer, error=result.error,
            failure=result.failure, reward=reward,
            rounds=result.rounds, totals=result.totals,
            started_at=started_at, finished_at=finished_at,
        )


def policy_of(result: RunResult, default: PolicyRef) -> PolicyRef:
    """The policy that planned this run: from its first plan attempt, else the worker's pool."""
    for rnd in result.rounds:
        for a in rnd.attempts:
            if a.conductor_id:
                return PolicyRef(name=a.conductor_id, version=a.policy_version or BASE)
    return default


class StoredRun(BaseModel):
    """One run of a group as the store read it back: its trace, or why it could not be read
    (a missing blob, an invalid document). Whether it is a rollout is not the store's to say
    (engine/rewards/rollouts.py)."""

    workflow_id: str
    run_id: str
    trace: Trace | None = None
    error: str | None = Field(default=None, description="why the trace could not be read")


class StoredGroup(BaseModel):
    """The `size` oldest root runs of one task under one policy version, oldest first, as the
    store read them (TraceStore.group_runs)."""

    task_id: str
    policy: PolicyRef
    runs: list[StoredRun]
