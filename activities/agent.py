"""The agent activity: one call of one agent on one step, through its provider.

While the provider call is in flight the activity heartbeats (when the workflow set a heartbeat
timeout): Temporal delivers a workflow's cancellation to a running activity only in answer to a
heartbeat, as asyncio.CancelledError in the activity's task, which then cancels the SDK's HTTP
request. Without heartbeats a cancelled run would wait out a long research call it no longer
wants, and pay for it.
"""

from __future__ import annotations

import asyncio
import time

import structlog
from temporalio import activity
from temporalio.exceptions import ApplicationError

from conductor_engine.activities.errors import to_application_error
from conductor_engine.activities.stashed_answers import stashed_or_called, until_storable
from conductor_engine.engine import observability as metrics
from conductor_engine.engine.contracts.activities import AgentCallInput
from conductor_engine.engine.contracts.agent_calls import TaskInfo
from conductor_engine.engine.contracts.names import AGENT_ACTIVITY
from conductor_engine.engine.contracts.records import AgentReply
from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.heartbeat import heartbeating
from conductor_engine.engine.plan.prompts import agent_messages
from conductor_engine.engine.providers import AgentCallError, CompletionRequest, complete
from conductor_engine.engine.providers.pool import Pool, PoolError
from conductor_engine.engine.rewards.verifiers import answer_key
from conductor_engine.engine.settings import Settings


class AgentActivities:
    def __init__(self, pool: Pool, settings: Settings | None = None) -> None:
        self.pool = pool
        self.settings = settings  # where large answers go (activities/stashed_answers.py)

    @activity.defn(name=AGENT_ACTIVITY)
    async def call_agent(self, req: AgentCallInput) -> AgentReply:
        info = activity.info()
        log = structlog.get_logger().bind(
            workflow_id=info.workflow_id, run_id=info.workflow_run_id,
            step=req.index, round=req.round, agent=req.agent, attempt=info.attempt,
        )
        try:
            spec = self.pool.get(req.agent)
        except PoolError as e:  # the worker's pool no longer has this agent
            raise ApplicationError(
                f"{e}; add it to the worker's pool file", type="UnknownAgent", non_retryable=True
            ) from e
        request = CompletionRequest(
            messages=agent_messages(req.question, req.subtask, req.seen,
                                    outer_question=req.outer_question,
                                    background=req.background),
            temperature=spec.params.temperature,
            top_p=spec.params.top_p,
            max_tokens=spec.params.max_tokens,
            web_search=spec.web_search if spec.searches_web else None,
            task=_task_info(req, spec.provider, info.attempt),
        )
        started = time.monotonic()
        try:
            completion = await heartbeating(stashed_or_called(lambda: complete(spec, request)))
        except AgentCallError as e:
            log.warning("agent call failed", error=e.message, retryable=e.retryable)
            metrics.record_error(activity.metric_meter(), agent=spec.id, provider=spec.provider,
                                 kind="step", error=e.kind,
                                 seconds=time.monotonic() - started)
            raise to_application_error(e) from e
        except asyncio.CancelledError:
            log.info("agent call cancelled", seconds=round(time.monotonic() - started, 3))
            raise
        seconds = time.monotonic() - started
        log.info("agent answered", seconds=round(seconds, 3), tokens=completion.usage.output_tokens)
        metrics.record_call(activity.metric_meter(), agent=spec.id, provider=spec.provider,
                            kind="step", input_tokens=completion.usage.input_tokens,
                            output_tokens=completion.usage.output_tokens,
                            cost_usd=completion.cost_usd, seconds=seconds)
        reply = AgentReply(
            output=completion.text, usage=completion.usage, cost_usd=completion.cost_usd,
            model=completion.model or spec.model, seconds=seconds, attempt=info.attempt,
            citations=completion.citations,
        )
        await until_storable(reply, self.settings)
        return reply


def _task_info(req: AgentCallInput, provider: str, attempt: int) -> TaskInfo | None:
    """The call's TaskInfo with this attempt; a sim agent also gets the earlier answers its
    step may read (`seen`), which its review rate acts on, and how the verifier reads the
    reference (`key`), which its answers follow. No other provider gets them: the answers are
    in its prompt already, and the reference is never shown to a model."""
    if req.task is None:
        return None
    if provider == "sim":
        reference = req.task.reference
        return revised(req.task, attempt=attempt,
                       seen=[v.output for v in (*req.background, *req.seen)],
                       key=answer_key(reference, req.task.verifier) if reference else None)
    return revised(req.task, attempt=attempt)
