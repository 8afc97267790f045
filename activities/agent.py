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
from typing import TypeVar

import structlog
from conductor_engine.activities.errors import to_application_error
from conductor_engine.engine.contracts.heartbeat import heartbeating
from conductor_engine.engine.contracts.records import AgentReply
from conductor_engine.engine.plan.prompts import agent_messages
from conductor_engine.engine.providers import AgentCallError, CompletionRequest, TaskInfo, complete
from conductor_engine.engine.providers.pool import Pool, PoolError
from conductor_engine.engine.tasks.model import VisibleStep
from pydantic import BaseModel, Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

T = TypeVar("T")


class AgentCallInput(BaseModel):
    agent: str
    question: str
    subtask: str
    visible: list[VisibleStep] = Field(default_factory=list)
    round: int = 0
    index: int = 0
    task: TaskInfo | None = Field(
        default=None,
        description="the task and rollout (sim agents answer by it; the activity sets attempt); "
        "None in histories from before it existed",
    )


class AgentActivities:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    @activity.defn(name="call_agent")
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
            messages=agent_messages(req.question, req.subtask, req.visible),
            temperature=spec.params.temperature,
            top_p=spec.params.top_p,
            max_tokens=spec.params.max_tokens,
            web_search=spec.web_search if spec.searches_web else None,
            task=req.task.model_copy(update={"attempt": info.attempt}) if req.task else None,
        )
        started = time.monotonic()
        try:
            completion = await heartbeating(complete(spec, request))
        except AgentCallError as e:
            log.warning("agent call failed", error=e.message, retryable=e.retryable)
            raise to_application_error(e) from e
        except asyncio.CancelledError:
            log.info("agent call cancelled", seconds=round(time.monotonic() - started, 3))
            raise
        seconds = time.monotonic() - started
        log.info("agent answered", seconds=round(seconds, 3), tokens=completion.usage.output_tokens)
        return AgentReply(
            output=completion.text, usage=completion.usage, cost_usd=completion.cost_usd,
            model=completion.model or spec.model, seconds=seconds, attempt=info.attempt,
            citations=completion.citations,
        )
