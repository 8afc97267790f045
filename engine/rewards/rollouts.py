"""Which finished runs are honest GRPO rollouts, why the others are left out, and the GRPO group
they form: the one place this is decided, for the training workflow (on a RunResult), the
trainer (on stored traces) and the reports (counts by reason). The trace store only reads runs.

GRPO compares the runs of one group with each other, so a run may only enter its group when its
reward says something about the plan the policy wrote. A malformed plan does (it scores the
recipe's `invalid_plan`, 0 in the paper); an infrastructure failure does not: a provider that
kept answering 500, a conductor that could not be reached, a verifier that crashed, a reward that
was never computed. Scoring those 0 would teach the policy that whatever it wrote was wrong, so
they are left out of their group and counted by reason instead (docs/concepts/rollout.md).

Pure functions over pydantic data: the training workflow (on a RunResult) and the trainer (on a
stored trace) classify a run the same way.

A rollout gets one plan attempt. Runs recorded outside training may have retried a malformed
plan with feedback (max_plan_attempts), so for them (`as_rollout`):
- a first round that needed several attempts: with one attempt the run would have ended at the
  first, an invalid plan. It becomes that run, so the policy learns from its failure instead of
  never seeing it: the first attempt only (its prompt holds no feedback), status invalid_plan,
  scored by the task's own weights.
- a refinement round that needed several: the one-attempt run would have kept the previous
  round's answer, whose reward was never computed: left out, "plan_retried".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, Field

from conductor_engine.engine.contracts.records import RoundRecord, RunResult
from conductor_engine.engine.contracts.rewards import Reward
from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.contracts.traces import PolicyRef, StoredGroup, StoredRun, Trace
from conductor_engine.engine.rewards.scoring import score_run

LeftOutReason = Literal[
    "step_failed",     # a step's agent exhausted its retries (or its self-call failed)
    "plan_failed",     # the conductor itself could not be called
    "run_failed",      # failed for another reason, or a trace that did not record which
    "cancelled",       # someone cancelled the run
    "verifier_error",  # the verifier failed: nothing was checked
    "untrusted",       # a verdict the candidate could have forged (assert-style code tests)
    "no_reward",       # no reward value: no reference, or the score activity failed
    "plan_retried",    # a stored run whose refinement round needed several plan attempts
    "unreadable",      # the stored trace could not be read (missing blob, invalid document)
    "grammar_rejected",  # a served plan's token ids break the plan grammar (trainer/reconstruct.py)
    "too_few_left",    # a usable run whose group kept fewer than MIN_GROUP runs
]

MIN_GROUP = 2
"""The fewest usable runs that still form a group: one run has no one to be compared with."""

FAILURE_REASONS: dict[str, LeftOutReason] = {
    "StepFailed": "step_failed",
    "PlanFailed": "plan_failed",
}
"""The ConductWorkflow's error types (RunResult.failure) → the reason its run is left out."""


def failure_reason(failure: str | None) -> LeftOutReason:
    """Why a failed run is left out, from the type of the error that ended it."""
    return FAILURE_REASONS.get(failure or "", "run_failed")


def verifier_failed(reward: Reward) -> bool:
    """Whether the verifier failed rather than judged: the verdict's details carry "error",
    or the scorer itself caught an exception (reason "verifier error: ...")."""
    verdict = reward.verdict
    return (verdict is not None and "error" in verdict.details) or \
        reward.reason.startswith("verifier error")


def left_out_reason(status: str, reward: Reward | None,
                    failure: str | None = None) -> LeftOutReason | None:
    """Why a finished run cannot be a rollout, or None when its reward is an honest one.

    `invalid_plan` is the policy's own doing and stays in (with its `invalid_plan` reward);
    a failed or cancelled run, a missing reward, a verifier failure and a verdict the candidate
    could have forged (`code_tests.UNTRUSTED`) are not."""
    if status == "failed":
        return failure_reason(failure)
    if status == "cancelled":
        return "cancelled"
    if reward is None or reward.value is None:
        return "no_reward"
    if verifier_failed(reward):
        return "verifier_error"
    if reward.verdict is not None and reward.verdict.untrusted:
        return "untrusted"
    return None


def ended_reason(cancelled: bool, error_type: str | None) -> LeftOutReason:
    """Why a run that ended in an exception is left out: a ConductWorkflow raises on a failed
    run (StepFailed, PlanFailed: `error_type`) and on a cancelled one."""
    return "cancelled" if cancelled else failure_reason(error_type)


def run_left_out(res: RunResult) -> LeftOutReason | None:
    """Why a child's run says nothing about the policy, or None when its reward counts."""
    reason = left_out_reason(res.status, res.reward, res.failure)
    if reason is not None or res.reward is None or res.reward.value is None:
        return reason or "no_reward"
    return None


def as_rollout(trace: Trace) -> Trace | LeftOutReason:
    """This run as a GRPO rollout (itself, or its one-attempt counterpart: see the module
    docstring), or why it is left out of its group."""
    if trace.rounds and len(trace.rounds[0].attempts) > 1:
        return _first_attempt_only(trace)
    if any(len(r.attempts) > 1 for r in trace.rounds[1:]):
        return "plan_retried"
    return left_out_reason(trace.status, trace.reward, trace.failure) or trace


def _first_attempt_only(trace: Trace) -> Trace | LeftOutReason:
    """The run as one plan attempt would have left it: an invalid plan (see as_rollout)."""
    tried = len(trace.rounds[0].attempts)
    first = trace.rounds[0].attempts[0]
    task = trace.task
    reward = score_run("invalid_plan", None, task.reference, task.verifier,
                       cost_usd=first.cost_usd, weights=task.options.reward)
    if reward.value is not None:
        reward.reason = (f"invalid plan: the first of {tried} attempts (the later ones saw "
                         f"retry feedback and are not trained on)")
    rollout = revised(
        trace, status="invalid_plan", answer=None, failure=None, reward=reward,
        error=f"first plan attempt rejected: {first.error}",
        rounds=[RoundRecord(index=0, attempts=[first])])
    return left_out_reason(rollout.status, reward) or rollout


class LeftOut(BaseModel):
    """A run of a group that is not one of its rollouts, and why."""

    workflow_id: str
    run_id: str
    reason: LeftOutReason
    detail: str | None = Field(default=None, description="the run's error, or the read error")


class PlanMean(BaseModel):
    """A rollout's plan's mean reward and the stored runs it rests on (the rollout's own
    included: 1 means its own reward): trainer/plan_means.py."""

    mean: float
    runs: int = Field(ge=1)


class Group(BaseModel):
    """GRPO's unit: the `size` oldest runs of one task under one policy version. `traces` are
    the honest rollouts among them (as `as_rollout` makes them), oldest first; `left_out`
    the others. The rollouts form the group when there are at least MIN_GROUP of them."""

    task_id: str
    policy: PolicyRef
    traces: list[Trace]
    left_out: list[LeftOut] = Field(default_factory=list)
    plan_means: list[PlanMean] | None = Field(
        default=None, description="each rollout's plan's mean reward over its stored runs, "
        "one per trace, when the recipe credits those ([rollouts] reward = 'plan_mean')")

    @property
    def trainable(self) -> bool:
        return len(self.traces) >= MIN_GROUP

    @property
    def rewards(self) -> list[float]:
        """The rollouts' rewards (every rollout has one: a run without is left out)."""
        return [t.reward.value if t.reward and t.reward.value is not None else 0.0
                for t in self.traces]

    @property
    def credited(self) -> list[float]:
        """What each rollout is credited with: its plan's mean reward when the group has them,
        else its own reward."""
        if self.plan_means is None:
            return self.rewards
        return [m.mean for m in self.plan_means]

    @property
    def runs(self) -> list[tuple[str, str]]:
        """(workflow id, run id) of every run the group decided on, rollout or left out."""
        return [(t.workflow_id, t.run_id) for t in self.traces] + \
            [(x.workflow_id, x.run_id) for x in self.left_out]

    def left_out_counts(self) -> dict[str, int]:
        """Runs not trained on, by reason; a group too small to form counts its rollouts as
        "too_few_left"."""
        reasons: list[str] = [x.reason for x in self.left_out]
        if not self.trainable:
            reasons += ["too_few_left"] * len(self.traces)
        return count_reasons(reasons)


def rollout_group(stored: StoredGroup) -> Group:
    """The GRPO group of a task's stored runs: each run its rollout, or left out with why (a
    trace that could not be read is left out, "unreadable", rather than failing the update
    that reads it at every retry, forever)."""
    members = [_member(run) for run in stored.runs]
    return Group(task_id=stored.task_id, policy=stored.policy,
                 traces=[m for m in members if isinstance(m, Trace)],
                 left_out=[m for m in members if isinstance(m, LeftOut)])


def _member(run: StoredRun) -> Trace | LeftOut:
    wid, rid = run.workflow_id, run.run_id
    if run.trace is None:
        return LeftOut(workflow_id=wid, run_id=rid, reason="unreadable", detail=run.error)
    rollout = as_rollout(run.trace)
    if isinstance(rollout, Trace):
        return rollout
    why = run.trace.error or (run.trace.reward.reason if run.trace.reward else None)
    return LeftOut(workflow_id=wid, run_id=rid, reason=rollout, detail=why)


def count_reasons(reasons: Iterable[str]) -> dict[str, int]:
    """Counts by reason, most frequent first (ties by name), for stats and their display."""
    counts = Counter(reasons)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def merge_counts(*counts: dict[str, int]) -> dict[str, int]:
    """Several counts by reason added up, in `count_reasons` order."""
    total: Counter[str] = Counter()
    for c in counts:
        total.update(c)
    return dict(sorted(total.items(), key=lambda kv: (-kv[1], kv[0])))


def describe_counts(counts: dict[str, int]) -> str:
    """"5 (verifier_error 4, step_failed 1)", or "0"."""
    total = sum(counts.values())
    if not total:
        return "0"
    return f"{total} ({', '.join(f'{k} {v}' for k, v in counts.items())})"
