"""A task as a user submits it, and the options of one conductor run."""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from conductor_engine.engine.contracts.plans import DEFAULT_MAX_STEPS, Plan
from conductor_engine.engine.contracts.rewards import RewardWeights
from conductor_engine.engine.contracts.strict import Strict


class RunOptions(Strict):
    """How one run is conducted. Defaults follow the paper (5 steps, temperature 1.0).
    A name that is no option is an error (a task file's misspelt option is refused, not
    silently run with the default)."""

    max_steps: int = Field(default=DEFAULT_MAX_STEPS, ge=1, le=20)
    refinement_rounds: int = Field(default=0, ge=0, le=5)
    self_call_depth: int = Field(default=2, ge=0, le=5)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    explore: float = Field(
        default=0.0, ge=0.0, lt=1.0,
        description="the plan's decisions drawn uniformly with this probability (a training "
        "rollout's [rollouts] explore; the local conductor only)",
    )
    explore_importance: bool = Field(
        default=False, description="an exploring run records the mixture's log-probs at its "
        "decisions, not the policy's ([rollouts] explore_importance)",
    )
    force_shape: str | None = Field(
        default=None, pattern=r"^(more|end|sees|apart)(,(more|end|sees|apart))*$",
        description="the plan's shape, forced: its outcomes joined by commas, e.g. "
        "'more,sees,end' (engine/plan/shapes.py; a training rollout's [rollouts] "
        "force_shapes; the local conductor only)",
    )
    max_plan_attempts: int = Field(default=3, ge=1, le=20)
    max_step_attempts: int = Field(default=5, ge=1, le=100)
    step_deadline_s: float = Field(
        default=900.0, gt=0, description="all attempts of one step (schedule-to-close)"
    )
    plan_timeout_s: float = Field(default=300.0, gt=0, description="one plan attempt")
    agent_heartbeat_s: float = Field(
        default=15.0, ge=1.0,
        description="agent calls heartbeat this often at most; a cancel reaches them this fast",
    )
    reward: RewardWeights = Field(
        default_factory=RewardWeights, description="how the run is scored (the paper's 0/0.5/1)"
    )
    record_deadline_s: float = Field(
        default=86400.0, gt=0,
        description="how long recording the trace is retried while the trace store is down",
    )
    subtask_max_chars: int = Field(
        default=2000, ge=8, le=4000,
        description="longest subtask the conductor may write under constrained decoding: room "
        "for the detailed instructions the paper credits (20 steps of the most still fit the "
        "parser's window)",
    )
    policy_version: str | None = Field(
        default=None, pattern=r"^(base|latest|v?[0-9]{1,9})$",
        description="pin the conductor's policy version for this run (training pins each "
        "iteration's rollouts); None follows the pool file",
    )
    sample: int = Field(
        default=0, ge=0,
        description="which rollout of a group this run is; seeds the sim provider",
    )
    result: Literal["full", "summary"] = Field(
        default="full",
        description="what the run returns: the whole RunResult, or its summary (set by the "
        "batch and training workflows on their children: RunResult.summary); self-calls "
        "always return whole",
    )
    seeded: bool = Field(
        default=False,
        description="sample each plan from a seed fixed by the task, sample, policy version, "
        "round and attempt, so the plan is the same whatever else the backend generates "
        "beside it (training rollouts: the curve does not depend on load). The local "
        "conductor then generates the plan alone, not batched with others",
    )
    plan: Plan | None = Field(
        default=None,
        description="a fixed plan: the run executes it instead of asking the conductor (the "
        "baselines of `conductor eval`: one agent alone, Mixture-of-Agents, a random plan, a "
        "fixed chain); its trace is recorded under the policy 'baseline', never trained on",
    )


class VisibleStep(BaseModel):
    """An earlier step as another step (or a self-call's sub-plan) gets to see it."""

    index: int
    agent: str
    subtask: str
    output: str


class Task(Strict):
    """One question to conduct, as a user, a task file or a self-call gives it. A name that is
    no field is an error."""

    id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    question: str = Field(min_length=1)
    reference: str | None = Field(default=None, description="the answer (or tests) to score by")
    verifier: str | None = Field(
        default=None, description="exact, choice, math or code; unset = guessed from the reference"
    )
    dataset: str | None = None
    tags: list[str] = Field(default_factory=list)
    parts: list[str] = Field(
        default_factory=list,
        description="a composite task: one tag per part, in the order the reference gives "
        "their answers, separated by \"; \" (sim agents answer each part apart; docs/plans.md)",
    )
    batch: str | None = Field(default=None, description="the batch this run belongs to, if any")
    options: RunOptions = Field(default_factory=RunOptions)
    context: list[VisibleStep] = Field(
        default_factory=list, description="what a self-call's parent step could see"
    )
    depth: int = Field(default=0, ge=0, description="0 for a user's task, +1 per self-call")
    agents: list[str] | None = Field(
        default=None, min_length=1,
        description="the agents this task may use, in the order the conductor is shown them; "
        "None = the whole pool (a user's requirement at inference; training's random subset "
        "of the pool per rollout group, which the trace records with the task)",
    )
    outer_question: str | None = Field(
        default=None,
        description="the question of the job a self-call's subtask belongs to (the outermost "
        "one, through nested self-calls); None for a user's task. The child's conductor and "
        "agents see it, so a subtask is never planned or answered out of its context",
    )

    @field_validator("agents")
    @classmethod
    def _distinct_agents(cls, agents: list[str] | None) -> list[str] | None:
        """An agent listed twice would be shown to the conductor twice: refuse it here, with
        the id, rather than let the plan prompt carry a duplicated pool."""
        if agents is not None:
            repeated = sorted({a for a in agents if agents.count(a) > 1})
            if repeated:
                raise ValueError(f"agents must be distinct; repeated: {', '.join(repeated)}")
        return agents

    @model_validator(mode="after")
    def _one_answer_per_part(self) -> Task:
        """A composite task's reference must list one answer per part, or no sim agent could
        ever answer it right: refuse it with both counts."""
        if self.parts and self.reference is not None:
            answers = len(self.reference.split("; "))
            if answers != len(self.parts):
                raise ValueError(
                    f"parts names {len(self.parts)} parts but the answer has {answers} "
                    "(separate the parts' answers with \"; \")")
        return self
