"""The score activity: check a run's answer against the task's reference and turn it into a
reward. Verifiers may run candidate code or a slow symbolic check, so they run in a thread, off
the worker's event loop; they never raise (a verifier failure is reward 0 with its reason)."""

from __future__ import annotations

import asyncio

from conductor_engine.engine.contracts.records import RunStatus
from conductor_engine.engine.rewards import Reward, RewardWeights, score_run
from pydantic import BaseModel
from temporalio import activity


class ScoreRequest(BaseModel):
    status: RunStatus
    answer: str | None = None
    reference: str | None = None
    verifier: str | None = None
    cost_usd: float = 0.0
    weights: RewardWeights = RewardWeights()


@activity.defn(name="score_run")
async def score(req: ScoreRequest) -> Reward:
    return await asyncio.to_thread(
        score_run, req.status, req.answer, req.reference, req.verifier,
        cost_usd=req.cost_usd, weights=req.weights,
    )
