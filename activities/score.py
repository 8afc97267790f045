"""The score activity: check a run's answer against the task's reference and turn it into a
reward. Verifiers may run candidate code or a slow symbolic check, so they run in a thread, off
the worker's event loop; they never raise (a verifier failure is reward 0 with its reason)."""

from __future__ import annotations

import asyncio

from temporalio import activity

from conductor_engine.engine.contracts.activities import ScoreRequest
from conductor_engine.engine.contracts.names import SCORE_ACTIVITY
from conductor_engine.engine.contracts.rewards import Reward
from conductor_engine.engine.heartbeat import heartbeats
from conductor_engine.engine.rewards import score_run


@activity.defn(name=SCORE_ACTIVITY)
async def score(req: ScoreRequest) -> Reward:
    """The reward; heartbeats while the verifier runs (a code verifier runs up to its own
    timeout), so a worker that dies meanwhile is noticed within the heartbeat timeout."""
    async with heartbeats():
        return await asyncio.to_thread(
            score_run, req.status, req.answer, req.reference, req.verifier,
            cost_usd=req.cost_usd, weights=req.weights,
        )
