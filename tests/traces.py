"""Traces as the trace store holds them, made up without running anything: `make_trace`."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from conductor_engine.engine.contracts.records import (
    PlanAttempt,
    RoundRecord,
    RunResult,
    StepRecord,
)
from conductor_engine.engine.contracts.rewards import Reward, RewardWeights, Verdict
from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.contracts.traces import PolicyRef, Trace


def make_trace(task_id: str, *, version: str = "v1", reward: float = 1.0,
               finished: datetime | None = None, dataset: str = "bench",
               output: str = "1024") -> Trace:
    """A realistic 3-step trace, as a run of the default scheme would leave it."""
    now = finished or datetime.now(UTC)
    steps = [
        StepRecord(round=0, index=i, agent=a, subtask=f"Subtask {i} of the plan.", access=acc,
                   sees=list(range(i)) if acc == "all" else [], status="done",
                   output=output if i == 2 else f"partial result {i} " * 20, model=a,
                   seconds=1.5, attempts=1)
        for i, (a, acc) in enumerate([("gpt", []), ("claude", []), ("gemini", "all")])
    ]
    attempt = PlanAttempt(attempt=1, raw_text='{"steps": [...]}' * 10, conductor_id="conductor",
                          policy_version=version, token_ids=list(range(120)),
                          logprobs=[-0.5] * 120)
    wid = f"conduct-{task_id}-{uuid.uuid4().hex[:6]}"
    result = RunResult(task_id=task_id, workflow_id=wid, run_id=str(uuid.uuid4()),
                       answer=output, rounds=[RoundRecord(index=0, attempts=[attempt],
                                                          steps=steps, answer=output)])
    verdict = Verdict(verifier="math", correct=reward == 1.0, score=reward, reason="checked")
    return Trace.from_run(
        Task(id=task_id, question="Which is larger, 2^10 or 10^3?", reference="1024",
             dataset=dataset, tags=["math", "easy"]),
        result, policy=PolicyRef(name="conductor", version=version),
        started_at=now - timedelta(seconds=5), finished_at=now,
        reward=Reward(value=reward, verdict=verdict, reason="", weights=RewardWeights()),
    )
