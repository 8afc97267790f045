"""ConductWorkflow: one conductor run, durable.

    plan (retried on parse failure; one attempt in training) ─▶ steps as a DAG ─▶ answer
       └─ refinement rounds: the conductor sees its last plan and answer, may plan again
    ─▶ score (when the task has a reference) ─▶ record the trace (every run, failed ones too)

Deterministic orchestration only: every model call is an activity (retried by Temporal), every
clock is workflow.time(), and a step given to the conductor itself runs as a child workflow.
How a step is retried is decided here, in `_agent_retry`.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeUpdate
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    FailureError,
    RetryState,
    TimeoutError,
)

with workflow.unsafe.imports_passed_through():
    from conductor_engine.engine.contracts.activities import (
        AgentCallInput,
        PlanRequest,
        PreviousRound,
        RecordRequest,
        ScoreRequest,
    )
    from conductor_engine.engine.contracts.agent_calls import TaskInfo
    from conductor_engine.engine.contracts.names import (
        AGENT_ACTIVITY,
        BASELINE_POLICY,
        CONDUCT_WORKFLOW,
        PLAN_ACTIVITY,
        PROGRESS_QUERY,
        RECORD_ACTIVITY,
        SCORE_ACTIVITY,
        plans_task_queue,
        self_call_id,
    )
    from conductor_engine.engine.contracts.plans import sees_label
    from conductor_engine.engine.contracts.records import (
        AgentReply,
        PlanAttempt,
        RoundRecord,
        RunResult,
        StepRecord,
    )
    from conductor_engine.engine.contracts.rewards import Reward
    from conductor_engine.engine.contracts.search_attributes import AGENTS, POLICY_VERSION, REWARD
    from conductor_engine.engine.contracts.strict import revised
    from conductor_engine.engine.contracts.tasks import SeenStep, Task, self_call_frame
    from conductor_engine.engine.tasks.checks import oversize_error
    from conductor_engine.engine.text import shorten

TRACES_PATCH = "score-and-record-traces"
SEARCH_ATTRIBUTES_PATCH = "search-attributes"

DEFAULT_AGENT_TIMEOUT_S = 120.0


_GAVE_UP = {
    RetryState.MAXIMUM_ATTEMPTS_REACHED: "no attempts left (max_step_attempts)",
    RetryState.TIMEOUT: "its deadline passed (step_deadline_s; a plan's: plan_deadline_s)",
}


def _cause(error: BaseException) -> str:
    """The innermost readable reason of an activity or child-workflow failure, and why no
    attempt follows when Temporal gave up retrying: an attempt's own message says "will be
    retried", which the last one's must not."""
    gave_up = _GAVE_UP.get(error.retry_state) if isinstance(  # type: ignore[arg-type]
        error, ActivityError | ChildWorkflowError) else None
    while isinstance(error, FailureError) and error.cause is not None:
        if isinstance(error, TimeoutError):
            break
        error = error.cause
    if isinstance(error, TimeoutError):
        kind = error.type.name.lower().replace("_", "-") if error.type else "timeout"
        reason = f"timed out ({kind})"
    else:
        reason = (getattr(error, "message", None) or str(error)).removesuffix(
            "; will be retried")
    return f"{reason}; gave up: {gave_up}" if gave_up else reason


@workflow.defn(name=CONDUCT_WORKFLOW)
class ConductWorkflow:
    def __init__(self) -> None:
        self._result = RunResult(task_id="")

    @workflow.query(name=PROGRESS_QUERY)
    def progress(self) -> RunResult:
        """The run so far: plans, step records and totals (for `conductor status`)."""
        return self._result

    @workflow.run
    async def run(self, task: Task) -> RunResult:
        if task.frame.depth == 0 and (too_large := oversize_error(task)) is not None:
            # Clients refuse such a task; one started some other way (the `temporal` CLI, an
            # older client) would carry it into payloads past the storage driver's cap, fail
            # that workflow task, and be retried forever. Fail now, with the reason, and leave
            # no trace (the trace would carry the same text). A self-call's context is its
            # parent's step outputs, which the run already carries, so it is not bounded here.
            raise ApplicationError(too_large, type="TaskTooLarge", non_retryable=True)
        info = workflow.info()
        result = self._result = RunResult(
            task_id=task.id, workflow_id=info.workflow_id, run_id=info.run_id
        )
        started, started_at = workflow.time(), workflow.now()
        try:
            await self._conduct(task)
        except (ApplicationError, asyncio.CancelledError) as e:
            # A step or the conductor failed for good, or someone cancelled the run: either way
            # the run leaves a trace, and then ends as it would have.
            reason = workflow.cancellation_reason()
            if reason is not None:
                result.status, result.error = "cancelled", f"cancelled: {reason or 'no reason'}"
            else:
                result.status = "failed"
                result.error = getattr(e, "message", None) or str(e) or type(e).__name__
                # what failed, so training can leave an infrastructure failure out of its group
                result.failure = getattr(e, "type", None)
            self._tally(workflow.time() - started)
            await self._score_and_record(task, started_at)
            if reason is not None:
                raise asyncio.CancelledError(result.error) from e
            raise
        self._tally(workflow.time() - started)
        await self._score_and_record(task, started_at)
        if task.options.result == "summary" and task.frame.depth == 0:
            # a batch's or training run's child: its parent's history keeps only a summary
            # (the whole run is in the trace just recorded); a self-call's step needs it whole
            return result.summary()
        return result

    async def _conduct(self, task: Task) -> None:
        """Plan and execute, round after round, into self._result."""
        result = self._result
        previous: list[PreviousRound] = []
        for r in range(task.options.refinement_rounds + 1):
            rnd = RoundRecord(index=r)
            result.rounds.append(rnd)
            attempt = await self._plan(task, rnd, previous)
            if rnd.plan is None:
                if r == 0:  # nothing to fall back on: a zero-reward rollout, not a crash
                    result.status = "invalid_plan"
                    result.error = (
                        f"no valid plan after {len(rnd.attempts)} attempt(s); "
                        f"last error: {attempt.error}"
                    )
                break  # a failed refinement round keeps the previous answer
            if not rnd.plan.steps:
                break  # an empty refinement plan keeps the previous answer
            await self._execute(task, rnd, attempt)
            rnd.answer = rnd.steps[-1].output
            result.answer = rnd.answer
            previous.append(PreviousRound(plan=rnd.plan, answer=rnd.answer))

    # --- scoring and recording -------------------------------------------------------------

    async def _score_and_record(self, task: Task, started_at: datetime) -> None:
        """Score the answer (when there is a reference) and write the trace. Recording is
        retried for as long as the options allow, so a trace store outage delays a run's
        result rather than losing its trace."""
        if not workflow.patched(TRACES_PATCH):
            return  # a run started before traces existed replays as it ran
        result, opts = self._result, task.options
        if task.reference is not None:
            self._details("scoring")
            try:
                result.reward = await workflow.execute_activity(
                    SCORE_ACTIVITY,
                    ScoreRequest(
                        status=result.status, answer=result.answer, reference=task.reference,
                        verifier=task.verifier, cost_usd=result.totals.cost_usd,
                        weights=opts.reward,
                    ),
                    result_type=Reward,
                    start_to_close_timeout=timedelta(seconds=120),
                    heartbeat_timeout=timedelta(seconds=30),  # it beats while verifying
                    retry_policy=RetryPolicy(maximum_attempts=3),
                    summary=f"score · {task.verifier or 'auto'}",
                )
            except ActivityError as e:
                workflow.logger.error("scoring failed: %s", _cause(e))
        if workflow.patched(SEARCH_ATTRIBUTES_PATCH):
            self._upsert_search_attributes()
        self._details("recording the trace")
        parent = workflow.info().parent
        try:
            await workflow.execute_activity(
                RECORD_ACTIVITY,
                RecordRequest(
                    task=task, result=result, started_at=started_at, finished_at=workflow.now(),
                    parent_workflow_id=parent.workflow_id if parent else None,
                ),
                start_to_close_timeout=timedelta(seconds=60),
                schedule_to_close_timeout=timedelta(seconds=opts.record_deadline_s),
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=60)),
                summary="record trace",
            )
        except ActivityError as e:  # the run's answer still stands; the log says what was lost
            workflow.logger.error("trace not recorded: %s", _cause(e))
        self._details()

    # --- planning --------------------------------------------------------------------------

    async def _plan(
        self, task: Task, rnd: RoundRecord, previous: list[PreviousRound]
    ) -> PlanAttempt:
        """Ask for a plan until one parses, recording every attempt with its raw text. A
        training rollout gets one attempt (the training workflow sets max_plan_attempts=1): as
        in the paper, a malformed plan scores 0 and no prompt it trains on holds retry
        feedback."""
        opts, last_error = task.options, None
        if opts.plan is not None and rnd.index == 0:
            # a baseline's fixed plan (`conductor eval`): no conductor call, recorded as the
            # plan of policy BASELINE_POLICY so training never mistakes it for a rollout
            attempt = PlanAttempt(attempt=1, raw_text=opts.plan.to_paper_form(),
                                  plan=opts.plan, conductor_id=BASELINE_POLICY)
            rnd.attempts.append(attempt)
            rnd.plan = opts.plan
            return attempt
        attempt = PlanAttempt(attempt=0, raw_text="")
        for n in range(1, opts.max_plan_attempts + 1):
            self._details(f"planning · round {rnd.index + 1} · attempt {n}")
            try:
                attempt = await workflow.execute_activity(
                    PLAN_ACTIVITY,
                    PlanRequest(
                        task=task, round=rnd.index, attempt=n, previous=previous,
                        last_error=last_error,
                    ),
                    result_type=PlanAttempt,
                    task_queue=plans_task_queue(workflow.info().task_queue),
                    start_to_close_timeout=timedelta(seconds=opts.plan_timeout_s),
                    schedule_to_close_timeout=timedelta(
                        seconds=opts.plan_deadline_s or opts.step_deadline_s),
                    heartbeat_timeout=timedelta(seconds=opts.agent_heartbeat_s),
                    retry_policy=self._agent_retry(task),
                    summary=f"plan · round {rnd.index + 1} · attempt {n} · "
                    f"{shorten(task.question, 60)}",
                )
            except ActivityError as e:  # the conductor itself could not be called
                raise ApplicationError(
                    f"planning round {rnd.index + 1} failed: {_cause(e)}",
                    type="PlanFailed", non_retryable=True,
                ) from e
            rnd.attempts.append(attempt)
            if attempt.plan is not None:
                rnd.plan = attempt.plan
                break
            last_error = attempt.error
        return attempt

    # --- executing -------------------------------------------------------------------------

    async def _execute(self, task: Task, rnd: RoundRecord, attempt: PlanAttempt) -> None:
        """Run the steps as a DAG: each step waits only for the steps it may read."""
        assert rnd.plan is not None
        for i, step in enumerate(rnd.plan.steps):
            rnd.steps.append(
                StepRecord(
                    round=rnd.index, index=i, agent=step.agent, subtask=step.subtask,
                    access=step.access, sees=step.sees(i),
                )
            )
        tasks: list[asyncio.Task[None]] = []
        for i in range(len(rnd.steps)):
            tasks.append(asyncio.create_task(self._step(task, rnd, i, tasks, attempt)))
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            raise
        finally:
            self._details()

    async def _step(
        self,
        task: Task,
        rnd: RoundRecord,
        i: int,
        tasks: list[asyncio.Task[None]],
        attempt: PlanAttempt,
    ) -> None:
        rec = rnd.steps[i]
        if rec.sees:
            await asyncio.gather(*(tasks[j] for j in rec.sees))
        seen = [
            SeenStep(index=j, agent=rnd.steps[j].agent, subtask=rnd.steps[j].subtask,
                        output=rnd.steps[j].output)
            for j in rec.sees
        ]
        rec.status = "running"
        self._details()
        started = workflow.time()
        label = f"step {i + 1}/{len(rnd.steps)}"
        try:
            self_call = rec.agent == attempt.conductor_id
            if self_call and task.frame.depth < task.options.self_call_depth:
                await self._self_call(task, rec, seen, attempt)
            else:
                await self._call_agent(task, rec, seen, attempt, label)
        except (ActivityError, ChildWorkflowError) as e:
            rec.status, rec.error = "failed", _cause(e)
            self._details()
            raise ApplicationError(
                f"{label} ({rec.agent}) failed: {rec.error}", type="StepFailed", non_retryable=True
            ) from e
        rec.seconds = workflow.time() - started
        rec.status = "done"
        self._details()

    async def _call_agent(
        self, task: Task, rec: StepRecord, seen: list[SeenStep], attempt: PlanAttempt,
        label: str,
    ) -> None:
        timeout = attempt.agent_timeouts.get(rec.agent, DEFAULT_AGENT_TIMEOUT_S)
        reply = await workflow.execute_activity(
            AGENT_ACTIVITY,
            AgentCallInput(
                agent=rec.agent, question=task.question, subtask=rec.subtask, seen=seen,
                round=rec.round, index=rec.index,
                task=TaskInfo(
                    task_id=task.id, tags=task.tags, reference=task.reference,
                    verifier=task.verifier, sample=task.sampling.sample, parts=task.parts,
                ),
                outer_question=task.frame.outer_question, background=self._background(task, rec),
            ),
            result_type=AgentReply,
            start_to_close_timeout=timedelta(seconds=timeout),
            schedule_to_close_timeout=timedelta(seconds=task.options.step_deadline_s),
            heartbeat_timeout=timedelta(seconds=task.options.agent_heartbeat_s),
            retry_policy=self._agent_retry(task),
            summary=f"{label} · {rec.agent} · {shorten(rec.subtask, 60)}",
        )
        rec.output, rec.usage, rec.cost_usd = reply.output, reply.usage, reply.cost_usd
        rec.citations = reply.citations
        rec.model, rec.attempts = reply.model, reply.attempt

    async def _self_call(
        self, task: Task, rec: StepRecord, seen: list[SeenStep], attempt: PlanAttempt
    ) -> None:
        """The conductor gave a step to itself: plan and run it as a child workflow.

        The child's question is the subtask; it also gets the job's question (`outer_question`,
        the outermost one through nested self-calls), what its step could see (`context`: the
        parent's background first when the step's access is "all", as for an agent step), and
        the task's `agents`, so a sub-plan keeps to the agents the task may use."""
        child_id = self_call_id(workflow.info().workflow_id, rec.round, rec.index)
        child = Task(
            id=self_call_id(task.id, rec.round, rec.index), question=rec.subtask,
            context=[*self._background(task, rec), *seen],
            options=revised(task.options, refinement_rounds=0, plan=None),
            frame=self_call_frame(task), sampling=task.sampling, agents=task.agents,
        )
        rec.child_workflow_id = child_id
        res = await workflow.execute_child_workflow(
            ConductWorkflow.run, child, id=child_id,
            static_summary=f"self-call · depth {child.frame.depth} · {shorten(rec.subtask, 120)}",
        )
        if res.status != "completed" or res.answer is None:
            # The sub-plan never parsed: let the conductor model answer the subtask directly.
            await self._call_agent(task, rec, seen, attempt, f"step {rec.index + 1}")
            rec.usage = rec.usage + res.totals.usage
            rec.cost_usd += res.totals.cost_usd
            return
        rec.output, rec.usage, rec.cost_usd = res.answer, res.totals.usage, res.totals.cost_usd
        rec.model, rec.attempts = "self-call", 1

    @staticmethod
    def _background(task: Task, rec: StepRecord) -> list[SeenStep]:
        """What of the parent's context a step of a self-call's sub-plan may see: all of it
        for a step whose access is "all" (it may read everything before it, and the parent
        step's view came before), none otherwise (an explicit list names this plan's steps
        only). Empty for a user's task, which has no context."""
        return list(task.context) if rec.access == "all" else []

    # --- bookkeeping -----------------------------------------------------------------------

    def _upsert_search_attributes(self) -> None:
        """What the UI's filter box can find a finished run by (the starter set batch, task and
        dataset): the policy version that planned it, the agents it used, its reward."""
        res = self._result
        updates: list[SearchAttributeUpdate[Any]] = [
            AGENTS.value_set(sorted({s.agent for s in res.steps}))]
        version = next((a.policy_version for r in res.rounds for a in r.attempts
                        if a.policy_version), None)
        if version:
            updates.append(POLICY_VERSION.value_set(version))
        if res.reward is not None and res.reward.value is not None:
            updates.append(REWARD.value_set(res.reward.value))
        workflow.upsert_search_attributes(updates)

    @staticmethod
    def _agent_retry(task: Task) -> RetryPolicy:
        """Model calls: quick first retry, exponential back-off, bounded attempts.
        Errors the provider marks non-retryable (401, 400, refusals) fail at once, and a
        Retry-After from the server overrides the back-off for that attempt."""
        return RetryPolicy(
            initial_interval=timedelta(seconds=1),
            backoff_coefficient=2.0,
            maximum_interval=timedelta(seconds=60),
            maximum_attempts=task.options.max_step_attempts,
        )

    def _tally(self, seconds: float) -> None:
        totals = self._result.totals
        totals.seconds = seconds
        for rnd in self._result.rounds:
            for a in rnd.attempts:
                totals.usage = totals.usage + a.usage
                totals.cost_usd += a.cost_usd
                totals.plan_calls += 1
            for s in rnd.steps:
                totals.usage = totals.usage + s.usage
                totals.cost_usd += s.cost_usd
                totals.agent_calls += 1
        self._details()

    def _details(self, headline: str | None = None) -> None:
        """The UI's 'current details': a Markdown table of the plan and its progress."""
        res = self._result
        reward = f" · reward {res.reward.value:g}" if res.reward and res.reward.value is not None \
            else ""
        lines = [headline or f"**{res.status}** · {res.task_id}{reward}"]
        for rnd in self._result.rounds:
            if not rnd.steps:
                continue
            lines += [
                "",
                f"Round {rnd.index + 1}",
                "",
                "| step | agent | subtask | sees | status | tokens in/out | s |",
                "|---|---|---|---|---|---|---|",
            ]
            for s in rnd.steps:
                sees = sees_label(s.sees)
                lines.append(
                    f"| {s.index + 1} | {s.agent} | {shorten(s.subtask, 50).replace('|', '/')} "
                    f"| {sees} | {s.status} | {s.usage.input_tokens}/{s.usage.output_tokens} "
                    f"| {s.seconds:.1f} |"
                )
        workflow.set_current_details("\n".join(lines))
