"""The plan activity: ask the conductor for a plan, then parse and validate it.

Parsing happens here, not in the workflow, so that improving the parser never breaks the replay
of running workflows; the activity returns the raw text with the plan or the parse error.
"""

from __future__ import annotations

import hashlib
import time

import structlog
from temporalio import activity
from temporalio.exceptions import ApplicationError

from conductor_engine.activities.errors import to_application_error
from conductor_engine.activities.stashed_answers import stashed_or_called, until_storable
from conductor_engine.engine import observability as metrics
from conductor_engine.engine.contracts.activities import PlanRequest
from conductor_engine.engine.contracts.names import PLAN_ACTIVITY
from conductor_engine.engine.contracts.policy_versions import VersionPin
from conductor_engine.engine.contracts.records import PlanAttempt
from conductor_engine.engine.heartbeat import heartbeats
from conductor_engine.engine.plan.language import PlanError, parse_plan, plan_json_schema
from conductor_engine.engine.plan.prompts import conductor_messages
from conductor_engine.engine.providers import (
    AgentCallError,
    CompletionRequest,
    capabilities,
    complete,
)
from conductor_engine.engine.providers.conductor_versions import ConductorVersions, adapter_lost
from conductor_engine.engine.providers.pool import AgentSpec, Pool, PoolError
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.policies import PolicyError


class PlanActivities:
    def __init__(self, pool: Pool, settings: Settings | None = None) -> None:
        self.pool = pool
        self.settings = settings
        self.conductors = ConductorVersions(pool, settings)

    async def conductor_at(self, pinned: VersionPin | None) -> tuple[AgentSpec, str]:
        """The conductor spec serving the wanted policy version, and that version's label
        (engine/providers/conductor_versions.py)."""
        return await self.conductors.at(pinned)

    @activity.defn(name=PLAN_ACTIVITY)
    async def write_plan(self, req: PlanRequest) -> PlanAttempt:
        """One plan attempt. It heartbeats throughout (loading a version, a local model's
        completion can take minutes), so a worker that dies mid-plan is noticed within the
        workflow's heartbeat timeout rather than the plan timeout."""
        async with heartbeats():
            return await self._write_plan(req)

    async def _write_plan(self, req: PlanRequest) -> PlanAttempt:
        info = activity.info()
        log = structlog.get_logger().bind(
            workflow_id=info.workflow_id, run_id=info.workflow_run_id,
            agent=self.pool.conductor.id, round=req.round, plan_attempt=req.attempt,
        )
        try:
            conductor, label = await self.conductor_at(req.task.options.policy_version)
        except PolicyError as e:
            raise ApplicationError(str(e), type="PolicyVersionUnavailable",
                                   non_retryable=True) from e
        except AgentCallError as e:  # vLLM could not load the version's adapter
            log.warning("conductor version not served", error=e.message, retryable=e.retryable)
            raise to_application_error(e) from e
        try:
            agents = task_agents(self.pool, req.task.agents)
        except PoolError as e:  # the same on every attempt: fail the run once, saying why
            raise ApplicationError(str(e), type="UnknownAgent", non_retryable=True) from e
        ids = [a.id for a in agents]
        opts, sampling = req.task.options, req.task.sampling
        json_mode = (conductor.structured_output
                     and capabilities(conductor.provider).structured_output)
        # the paper's think-then-plan under a schema: the reasoning field comes first, bounded
        reasoning = conductor.reasoning_max_chars if conductor.plan_form == "reasoning" else None
        request = CompletionRequest(
            messages=conductor_messages(
                req.task.question, agents, max_steps=opts.max_steps, json_mode=json_mode,
                reasoning_max_chars=reasoning,
                context=req.task.context, previous=[(p.plan, p.answer) for p in req.previous],
                last_error=req.last_error, outer_question=req.task.frame.outer_question,
            ),
            temperature=opts.temperature,
            top_p=conductor.params.top_p,
            max_tokens=conductor.params.max_tokens,
            json_schema=plan_json_schema(
                ids, opts.max_steps, allow_empty=req.allow_empty,
                subtask_max_chars=opts.subtask_max_chars, reasoning_max_chars=reasoning,
            ) if json_mode else None,
            seed=plan_seed(req, label) if sampling.seeded else None,
            explore=sampling.explore, explore_importance=sampling.explore_importance,
            force_shape=sampling.force_shape, force_agent=sampling.force_agent,
        )
        started = time.monotonic()
        try:
            completion = await stashed_or_called(lambda: complete(conductor, request))
        except AgentCallError as e:
            failure = adapter_lost(conductor, e) or e
            log.warning("conductor call failed", error=failure.message,
                        retryable=failure.retryable)
            metrics.record_error(activity.metric_meter(), agent=conductor.id,
                                 provider=conductor.provider, kind="plan", error=failure.kind,
                                 seconds=time.monotonic() - started)
            raise to_application_error(failure) from e
        shaped = completion.token_ids is not None and bool(
            sampling.force_shape or sampling.force_agent)
        out = PlanAttempt(
            attempt=req.attempt, raw_text=completion.text, usage=completion.usage,
            cost_usd=completion.cost_usd, seconds=time.monotonic() - started,
            conductor_id=conductor.id, policy_version=label,
            prompt=request.messages, finish_reason=completion.finish_reason,
            token_ids=completion.token_ids,
            logprobs=completion.logprobs,
            forced_positions=completion.forced_positions,
            choice_tokens=completion.choice_tokens,
            json_schema=request.json_schema if completion.token_ids is not None
            and (completion.forced_positions is None or shaped) else None,
            forced_shape=sampling.force_shape if shaped else None,
            forced_agent=sampling.force_agent if shaped else None,
            agent_timeouts={a.id: a.timeout_s for a in agents},
        )
        try:
            out.plan = parse_plan(
                completion.text, ids, max_steps=opts.max_steps, allow_empty=req.allow_empty
            )
            log.info("plan written", steps=len(out.plan))
        except PlanError as e:
            out.error = str(e)
            # Not a warning: a rejected plan is the conductor's mistake, which the run handles
            # (another attempt, or invalid_plan), the trace records and `conductor run` counts
            # in its plans; at warning it printed a raw log line in the middle of the CLI's.
            log.info("plan rejected", error=out.error)
        meter = activity.metric_meter()
        metrics.record_call(meter, agent=conductor.id, provider=conductor.provider, kind="plan",
                            input_tokens=completion.usage.input_tokens,
                            output_tokens=completion.usage.output_tokens,
                            cost_usd=completion.cost_usd, seconds=out.seconds)
        metrics.record_plan(meter, agent=conductor.id, provider=conductor.provider,
                            valid=out.plan is not None)
        await until_storable(out, self.settings)
        return out


def task_agents(pool: Pool, wanted: list[str] | None) -> list[AgentSpec]:
    """The agents a task's conductor is shown and may plan with: the pool's available agents
    (`Pool.available`: the configured ones, and the conductor when offered), or, when the task
    names `agents`, exactly those, in the task's order (a user's requirement at inference;
    training's random subset of the pool per rollout group). PoolError, in one line, for an id
    the worker cannot offer: a plan naming it could never run here."""
    available = pool.available()
    if wanted is None:
        return available
    by_id = {a.id: a for a in available}
    out = []
    for agent_id in wanted:
        spec = by_id.get(agent_id)
        if spec is None:
            raise PoolError(_unavailable(pool, agent_id, [a.id for a in available]))
        out.append(spec)
    return out


def _unavailable(pool: Pool, agent_id: str, available: list[str]) -> str:
    """Why the task's agent `agent_id` cannot be offered by this worker's pool."""
    offered = f"this worker offers: {', '.join(available)}"
    if agent_id == pool.conductor.id:
        return (f"the task's agents name the conductor {agent_id!r}, but the pool does not "
                f"offer it as an agent (offer_conductor_as_agent = false); {offered}")
    spec = next((a for a in pool.agents if a.id == agent_id), None)
    if spec is None:
        return (f"the task's agents name {agent_id!r}, which this worker's pool does not have; "
                f"{offered}")
    need = f"set {spec.api_key_env}" if spec.api_key_env else "give it a base_url"
    return (f"the task's agents name {agent_id!r}, which this worker's pool has but cannot "
            f"call ({need}); {offered}")


def plan_seed(req: PlanRequest, label: str) -> int:
    """The sampling seed of one plan attempt, from what identifies the draw (task, rollout,
    policy version, round, attempt; never a clock or a run id), so a rollout is the same plan
    however busy the machine is, while the rollouts of a group draw apart."""
    t = req.task
    key = "\x1f".join(map(str, ("plan", t.id, t.frame.depth, t.sampling.sample, label, req.round,
                                  req.attempt)))
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % 2**53
