"""A task as a user submits it, the options a user sets for its run, and what the engine sets
apart from them: how a training run samples the plan (`RolloutSampling`) and where a self-call
sits (`SelfCallFrame`), each built by its own function (`rollout_sampling`, `self_call_frame`).

Histories and traces recorded before that split carry the engine's fields flat (`depth` and
`outer_question` on the task, `sample`, `seeded`, `explore` and `explore_importance` in its
options); `Task` reads them into the sub-models, so old workflow histories still replay.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from conductor_engine.engine.contracts.plans import DEFAULT_MAX_STEPS, Plan
from conductor_engine.engine.contracts.policy_versions import VersionPin
from conductor_engine.engine.contracts.rewards import RewardWeights
from conductor_engine.engine.contracts.strict import Strict

FLAT_FRAME_FIELDS = ("depth", "outer_question")
"""The frame's fields as a task carried them flat before `Task.frame`."""
FLAT_SAMPLING_FIELDS = ("sample", "seeded", "explore", "explore_importance")
"""The sampling's fields as a task's options carried them flat before `Task.sampling`."""


class RunOptions(Strict):
    """How one run is conducted, as a user sets it (`conductor run`'s flags, a task file's
    `options`, the Python API, a served model name's version). Defaults follow the paper
    (5 steps, temperature 1.0). A name that is no option is an error (a task file's misspelt
    option is refused, not silently run with the default); what only the engine sets lives in
    `Task.sampling` and `Task.frame`."""

    elsewhere: ClassVar[Mapping[str, str]] = {
        name: f"the engine sets it on a training run's tasks (Task.sampling.{name})"
        for name in FLAT_SAMPLING_FIELDS}

    max_steps: int = Field(default=DEFAULT_MAX_STEPS, ge=1, le=20)
    refinement_rounds: int = Field(default=0, ge=0, le=5)
    self_call_depth: int = Field(default=2, ge=0, le=5)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    max_plan_attempts: int = Field(default=3, ge=1, le=20)
    max_step_attempts: int = Field(default=5, ge=1, le=100)
    step_deadline_s: float = Field(
        default=900.0, gt=0, description="all attempts of one step (schedule-to-close)"
    )
    plan_timeout_s: float = Field(default=300.0, gt=0, description="one plan attempt")
    plan_deadline_s: float | None = Field(
        default=None, gt=0,
        description="all attempts of one plan, the wait for a conductor slot included "
        "(schedule-to-close); None: step_deadline_s. A training run gives its own runs a day "
        "(limits.py TRAINING_PLAN_DEADLINE_S): they queue behind its fan-out for the conductor, "
        "so a slow machine slows them rather than losing them",
    )
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
    policy_version: VersionPin | None = Field(
        default=None,
        description="pin the conductor's policy version for this run (a served model name "
        "`conductor@vK`, `conductor eval --policy`; training pins each iteration's rollouts "
        "and held-out runs the same way); None follows the pool file",
    )
    result: Literal["full", "summary"] = Field(
        default="full",
        description="what the run returns: the whole RunResult, or its summary (set by the "
        "batch and training workflows on their children: RunResult.summary); self-calls "
        "always return whole",
    )
    plan: Plan | None = Field(
        default=None,
        description="a fixed plan: the run executes it instead of asking the conductor (the "
        "baselines of `conductor eval`: one agent alone, Mixture-of-Agents, a random plan, a "
        "fixed chain); its trace is recorded under the policy 'baseline', never trained on",
    )


class SeenStep(BaseModel):
    """An earlier step as another step (or a self-call's sub-plan) gets to see it."""

    index: int
    agent: str
    subtask: str
    output: str


class RolloutSampling(Strict):
    """How a training run samples one run's plan: which rollout of its group it is, from a
    seed fixed by what identifies the draw, and how much it explores. Set by the engine only
    (`rollout_sampling`); a user's run keeps the default (sample 0, unseeded, no exploring)."""

    sample: int = Field(
        default=0, ge=0,
        description="which rollout of a group this run is; seeds the sim provider",
    )
    seeded: bool = Field(
        default=False,
        description="sample each plan from a seed fixed by the task, sample, policy version, "
        "round and attempt, so the plan is the same whatever else the backend generates "
        "beside it (training rollouts: the curve does not depend on load). The local "
        "conductor then generates the plan alone, not batched with others",
    )
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
        "'more,sees,end' (engine/contracts/plan_shapes.py; a training rollout's [rollouts] "
        "force_shapes; the local conductor only)",
    )
    force_agent: str | None = Field(
        default=None, min_length=1,
        description="the plan's first step's agent, forced (a warm-up sample's [warmup] "
        "force_agents; the local conductor only): engine/providers/local/shaping.py",
    )


def rollout_sampling(sample: int, *, explore: float = 0.0, explore_importance: bool = False,
                     force_shape: str | None = None,
                     force_agent: str | None = None) -> RolloutSampling:
    """A training run's sampling of rollout `sample` (0 for a held-out run): always seeded, so
    the same rollouts come whatever the load; exploring at `explore` ([rollouts] explore); its
    shape forced to `force_shape` ([rollouts] force_shapes), its first step's agent to
    `force_agent` ([warmup] force_agents)."""
    return RolloutSampling(sample=sample, seeded=True, explore=explore,
                           explore_importance=explore_importance, force_shape=force_shape,
                           force_agent=force_agent)


class SelfCallFrame(Strict):
    """Where a run sits among self-calls: a user's task is the outermost frame (depth 0, no
    outer question); a self-call's child is one deeper (`self_call_frame`)."""

    depth: int = Field(default=0, ge=0, description="0 for a user's task, +1 per self-call")
    outer_question: str | None = Field(
        default=None,
        description="the question of the job a self-call's subtask belongs to (the outermost "
        "one, through nested self-calls); None for a user's task. The child's conductor and "
        "agents see it, so a subtask is never planned or answered out of its context",
    )


def self_call_frame(parent: Task) -> SelfCallFrame:
    """The frame of a self-call made by a step of `parent`: one deeper, knowing the outermost
    job's question."""
    return SelfCallFrame(depth=parent.frame.depth + 1,
                         outer_question=parent.frame.outer_question or parent.question)


class Task(Strict):
    """One question to conduct, as a user, a task file or a self-call gives it. A name that is
    no field is an error. `sampling` and `frame` are the engine's (a training run's rollouts,
    a self-call's child); a user's task keeps their defaults."""

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
        "their answers, separated by \"; \" (sim agents answer each part apart; "
        "docs/how-to/rehearse-plans.md)",
    )
    batch: str | None = Field(default=None, description="the batch this run belongs to, if any")
    options: RunOptions = Field(default_factory=RunOptions)
    context: list[SeenStep] = Field(
        default_factory=list,
        description="background the conductor sees when it plans (and steps whose access is "
        "\"all\"): a chat's earlier messages (`conductor serve`), or what a self-call's parent "
        "step could see",
    )
    agents: list[str] | None = Field(
        default=None, min_length=1,
        description="the agents this task may use, in the order the conductor is shown them; "
        "None = the whole pool (a user's requirement at inference; training's random subset "
        "of the pool per rollout group, which the trace records with the task)",
    )
    sampling: RolloutSampling = Field(
        default_factory=RolloutSampling,
        description="set by the engine: how a training run samples this run's plan",
    )
    frame: SelfCallFrame = Field(
        default_factory=SelfCallFrame,
        description="set by the engine: where this run sits among self-calls",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_flat(cls, data: Any) -> Any:
        """A task as recorded before `frame` and `sampling` (a workflow history, a stored
        trace): its flat `depth`/`outer_question` become `frame`, its options'
        `sample`/`seeded`/`explore`/`explore_importance` become `sampling`. Runs before
        `Strict`'s check of names (pydantic runs a subclass's before-validators first)."""
        if not isinstance(data, dict):
            return data
        frame = {k: data[k] for k in FLAT_FRAME_FIELDS if k in data}
        options = data.get("options")
        sampling = ({k: options[k] for k in FLAT_SAMPLING_FIELDS if k in options}
                    if isinstance(options, dict) else {})
        if not frame and not sampling:
            return data
        data = {k: v for k, v in data.items() if k not in frame}
        for name, flat in (("frame", frame), ("sampling", sampling)):
            if flat and name in data:
                raise ValueError(f"give Task field {name!r} or its old flat fields "
                                 f"({', '.join(flat)}), not both")
            if flat:
                data[name] = flat
        if sampling:
            assert isinstance(options, dict)
            data["options"] = {k: v for k, v in options.items() if k not in sampling}
        return data

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
