"""The training recipe and the update activity's input and output, free of torch.

`TrainingWorkflow` carries these through Temporal, so they must import without torch: the
workflow runs on an ordinary engine worker; only the trainer service loads the model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from conductor_engine.engine.contracts.plans import Plan
from conductor_engine.engine.contracts.policy_versions import Version
from conductor_engine.engine.contracts.strict import Strict
from conductor_engine.engine.contracts.task_list_refs import TaskList
from conductor_engine.engine.contracts.tasks import Task


def _trl(name: str, trl_name: str) -> AliasChoices:
    """A field read under its own name or under TRL's GRPOConfig name for it."""
    return AliasChoices(name, trl_name)


class _TrlNames(Strict):
    """A recipe section that also takes TRL's GRPOConfig names for its fields (`_trl` aliases),
    so a recipe written for TRL reads the same here. A field given under both names is an
    error, not a silent choice of one."""

    model_config = ConfigDict(populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _one_name_each(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, field in cls.model_fields.items():
                alias = field.validation_alias
                if isinstance(alias, AliasChoices):
                    given = [str(c) for c in alias.choices if c in data]
                    if len(given) > 1:
                        raise ValueError(f"{' and '.join(given)} name the same setting "
                                         f"({name}): give one")
        return data


class RolloutConfig(_TrlNames):
    """Which traces an update trains on."""

    group_size: int = Field(default=8, ge=2, description="G: rollouts per task in a group",
                            validation_alias=_trl("group_size", "num_generations"))
    groups_per_update: int = Field(default=4, ge=1, description="tasks per update")
    max_staleness: int = Field(
        default=1, ge=0, description="train on groups at most this many versions old"
    )
    stale_discount: float = Field(
        default=1.0, gt=0, le=1, description="advantage weight per version of age (1 = none)"
    )
    scale_rewards: bool = Field(
        default=True, description="divide advantages by the group's std (False = Dr. GRPO); "
        "TRL's 'group' and 'none' mean true and false"
    )
    baseline: Literal["group", "batch"] = Field(
        default="group",
        description="what a rollout's reward is measured against: 'group', its task's G "
        "rollouts (GRPO; a group whose rollouts all scored alike teaches nothing), or 'batch', "
        "every rollout of the update (REINFORCE++'s global baseline): a group that all failed "
        "still pushes its choices down, so a conductor that sends every kind of task to one "
        "agent is corrected by the kinds that agent fails, not only by the rare group that "
        "tried another. scale_rewards then divides by the batch's std",
    )
    dataset: str | None = Field(default=None, description="only groups of this dataset")
    task_ids: list[str] | None = Field(default=None, description="only these tasks")
    pool_subset_min: int | None = Field(
        default=None, ge=1,
        description="each rollout group plans with a random subset of the pool of at least this "
        "many agents (None: 1 when a max is given, else the whole pool), as the paper trains "
        "so the conductor adapts to any set of agents",
    )
    pool_subset_max: int | None = Field(
        default=None, ge=1,
        description="at most this many agents in a group's subset (None: the whole pool)",
    )
    explore: float = Field(
        default=0.0, ge=0.0, lt=1.0,
        description="epsilon: each decision of a rollout's plan (which agent, which access, "
        "one more step or not) is drawn uniformly over its options (the allowed tokens grouped "
        "by first character) with this probability, else from the policy; the behaviour "
        "log-probs are the policy's (or the mixture's: explore_importance). An agent or a "
        "plan shape the untrained conductor almost never writes gets tried (the local "
        "conductor only: a served one samples without it)",
    )
    explore_importance: bool = Field(
        default=False,
        description="record an exploring rollout's decisions with the mixture's log-probs, so "
        "the trainer's ratio pi/mu weighs an explored choice by the policy's own odds (an "
        "unbiased, slow push: the expected gradient of not exploring); false: with the "
        "policy's, so an explored choice that paid counts as if the policy had made it (a "
        "biased, faster push, ε-greedy's)",
    )
    reward: Literal["run", "plan_mean"] = Field(
        default="run",
        description="what a rollout is credited with: 'run', its own run's reward (one draw of "
        "the agents' answers); 'plan_mean', the mean reward of every stored run this training "
        "run made of the same task with the same plan (each step's agent and what it sees, "
        "not the subtasks' wording: trainer/plan_means.py): its rollouts of every version, "
        "its warm-up's samples and rehearsals. Given the plan the reward does not depend on the "
        "policy, so the mean estimates the same expectation with less noise. Runs of more than "
        "one round or with a self-call keep their own reward",
    )
    plan_runs: int = Field(
        default=256, ge=1, le=4096,
        description="reward = 'plan_mean': the newest N scored runs of each task of an update "
        "read for the means",
    )
    credit: Literal["rollout", "shape"] = Field(
        default="rollout",
        description="'rollout': every token of a rollout takes its advantage; 'shape': credit "
        "per plan shape (docs/concepts/grpo.md): each decision is measured against the "
        "group's rollouts of the same shape, and the tokens that choose the shape (the `,` "
        "that adds a step against the `]` that ends, an access list that sees or not) get "
        "the shape's mean against the task's, so a step added with the wrong agent in it does "
        "not unlearn adding a step. Needs baseline = 'group'",
    )
    force_shapes: float = Field(
        default=0.0, ge=0.0, le=1.0,
        description="the share of each group whose plan shape is forced, the shapes a task's "
        "max_steps allows taken in turn (one step; two, the second seeing the first or not; "
        "...): the shape's tokens are forced and stay out of the loss, the agents, subtasks "
        "and access inside it are sampled from the policy. Needs credit = 'shape' and the "
        "local conductor",
    )
    force_shapes_iterations: int | None = Field(
        default=None, ge=1,
        description="the forced share falls linearly from force_shapes to 0 over this many "
        "iterations; after that forcing happens only in groups where every unforced rollout "
        "failed: a group's unforced rollouts run first, and its last round(force_shapes × G) "
        "are forced only when none of them answered right. None: the share stays "
        "force_shapes",
    )
    shuffle_pool: bool = Field(
        default=False,
        description="show each group its agents in a random order, not the pool file's: no "
        "bias for whichever agent comes first",
    )
    vary_pool_per: Literal["group", "rollout"] = Field(
        default="group",
        description="'group': one subset and order per task, shared by its G runs, so the "
        "advantages compare plans made with the same agents; 'rollout': each run draws its "
        "own, as the paper trains: a run sees the pool as some other run did not, so an "
        "agent the untrained conductor favours (by name or by place) is sometimes absent or "
        "elsewhere, and the others get tried",
    )

    @field_validator("scale_rewards", mode="before")
    @classmethod
    def _trl_scale_rewards(cls, value: Any) -> Any:
        """TRL's string values: 'group' (its default) and 'none'; its 'batch' has no equal
        here (advantages are per group)."""
        if isinstance(value, str) and value.lower() in ("group", "none"):
            return value.lower() == "group"
        if isinstance(value, str) and value.lower() == "batch":
            raise ValueError("'batch' (TRL's std over the whole batch) is not supported: use "
                             "true ('group') or false ('none')")
        return value

    @model_validator(mode="after")
    def _shape_credit(self) -> RolloutConfig:
        if self.credit == "shape" and self.baseline != "group":
            raise ValueError("credit = 'shape' measures rollouts within their task's group: "
                             "set baseline = 'group'")
        if self.force_shapes and self.credit != "shape":
            raise ValueError(f"force_shapes = {self.force_shapes} needs credit = 'shape' (a "
                             f"forced rollout is measured against rollouts of its shape)")
        return self

    @model_validator(mode="after")
    def _subset_bounds(self) -> RolloutConfig:
        lo, hi = self.pool_subset_min, self.pool_subset_max
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"pool_subset_min ({lo}) is greater than pool_subset_max ({hi})")
        return self

    @property
    def varies_pool(self) -> bool:
        """Whether rollout groups get their own agents (a subset, or an order) at all."""
        return self.shuffle_pool or self.pool_subset_min is not None \
            or self.pool_subset_max is not None


class LossConfig(_TrlNames):
    """The GRPO objective and optimiser step (names and meanings follow TRL's GRPOConfig; its
    own names are accepted too: `epsilon`, `mask_truncated_completions`,
    `per_device_train_batch_size`, `num_iterations`)."""

    loss_type: Literal["grpo", "dr_grpo", "dapo"] = Field(
        default="dapo", description="how token losses are aggregated, as TRL's loss_type")
    epsilon_low: float = Field(default=0.2, ge=0, description="clip range below 1",
                               validation_alias=_trl("epsilon_low", "epsilon"))
    epsilon_high: float = Field(default=0.2, ge=0, description="clip range above 1 (clip-higher)")
    beta: float = Field(
        default=0.0, ge=0, description="the KL term's weight (0 = none); the reference is the "
        "version GRPO started from where a warm-up published one (so the KL keeps the plans the "
        "warm-up taught, as TRL's GRPO after SFT is held to the SFT model), else the frozen base")
    mask_truncated: bool = Field(default=False, description="drop completions cut at max_tokens",
                                 validation_alias=_trl("mask_truncated",
                                                       "mask_truncated_completions"))
    max_completion_length: int = Field(default=512, gt=0, description="dr_grpo's normaliser")
    temperature: float = Field(default=1.0, gt=0, le=2.0,
                               description="the rollouts' sampling temperature, at which the "
                               "trainer also scores their tokens")
    learning_rate: float = Field(default=1e-6, gt=0, description="AdamW's, set before each update")
    max_grad_norm: float = Field(default=1.0, gt=0, description="gradient clipping")
    micro_batch_size: int = Field(default=8, ge=1, description="gradient accumulation unit",
                                  validation_alias=_trl("micro_batch_size",
                                                        "per_device_train_batch_size"))
    steps_per_update: int = Field(
        default=1, ge=1,
        description="mu: optimiser steps on the same rollouts (TRL's num_iterations); past the "
        "first, the clipped ratio against the sampling policy keeps each step near it",
        validation_alias=_trl("steps_per_update", "num_iterations"),
    )

    @model_validator(mode="before")
    @classmethod
    def _trl_epsilon_high(cls, data: Any) -> Any:
        """TRL's `epsilon_high` defaults to its `epsilon`: a recipe written for TRL that sets
        only `epsilon` clips both sides at it here too."""
        if isinstance(data, dict) and "epsilon" in data and "epsilon_high" not in data:
            return {**data, "epsilon_high": data["epsilon"]}
        return data


class PolicyConfig(Strict):
    """The model being trained."""

    base: str = Field(
        default="smollm2-135m-instruct",
        description="a Hugging Face id, a local directory, or the engine's local default",
    )
    lora: bool = Field(default=True, description="train a LoRA adapter; false: every weight")
    lora_r: int = Field(default=16, ge=1, description="the adapter's rank")
    lora_alpha: int = Field(default=32, ge=1, description="the adapter's scale numerator")
    lora_dropout: float = Field(default=0.0, ge=0, lt=1, description="dropout on its input")
    lora_target_modules: str | list[str] = Field(
        default="all-linear", description="the modules adapted, as peft's target_modules")
    device: str | None = Field(default=None, description="None: cuda when present, else cpu")
    bf16: bool | None = Field(
        default=None, description="store the weights in bfloat16 (None: a LoRA policy's frozen "
        "base where CUDA supports it; a full policy and a LoRA adapter stay float32)")
    gradient_checkpointing: bool | None = Field(
        default=None, description="None: on the GPU, for a micro-batch whose activations would "
        "not fit the free memory; off on CPU")
    precision: Literal["bf16-mixed", "fp32"] | None = Field(
        default=None, description="the passes' compute: 'bf16-mixed' runs the transformer's "
        "matmuls in bfloat16 (autocast) while weights, gradients and AdamW state keep their "
        "float32; None: bf16-mixed where CUDA supports bfloat16, else fp32")


class HeldOutConfig(Strict):
    """Evaluating as training goes: a share of the task file is never trained on, and every
    `every` iterations the version just published answers it (greedy by default), so the curve
    to watch is accuracy on tasks the policy never saw, not the noisy reward of the last
    iteration's few training tasks."""

    fraction: float = Field(
        default=0.0, ge=0.0, lt=1.0,
        description="share of each tag's tasks held out (0: no split, no evaluation)")
    every: int = Field(default=1, ge=1, description="evaluate after every K-th iteration")
    temperature: float = Field(default=0.0, ge=0.0, le=2.0,
                               description="0: greedy, the conductor's single best plan")
    seed: int = Field(default=0, ge=0, description="which tasks are held out")


class CheckpointConfig(Strict):
    """What the blob store keeps of published versions (engine/storage/retention.py, applied
    after every publish and by `conductor train prune`; docs/how-to/checkpoints.md). Defaults keep a
    200-iteration run at a few versions' worth of disk: at 7B an optimiser state is 2 GB (LoRA
    r=64) to 56 GB (full), a checkpoint 0.6 to 28 GB. The newest version always keeps both;
    pinned versions, and versions a plan used in the last `served_minutes`, keep their
    checkpoint."""

    keep_optimizer_states: int = Field(
        default=2, ge=1, description="the newest K versions keep their optimiser state (the "
        "trainer only ever continues from the newest)")
    keep_checkpoints: int | None = Field(
        default=5, ge=1, description="the newest N versions keep their checkpoint, besides "
        "pinned and recently served ones; none = keep every checkpoint")
    served_minutes: float = Field(
        default=15.0, ge=0, description="a version a plan used this recently keeps its "
        "checkpoint: plans in flight, evaluations and serving of a pinned version")


class WarmupConfig(Strict):
    """A warm start before GRPO (`[warmup]`): fine-tune the policy on the best plans already
    executed and scored on the run's training tasks, publish that as a version, and let GRPO
    continue from it. A small conductor that almost never samples a multi-step plan cannot be
    taught one by GRPO, which credits only what its rollouts wrote; plans that paid when a
    stronger conductor (or an exploring rollout) wrote them can (trainer/warmup.py). Only
    executed, scored runs are read: never a task's reference or an oracle file."""

    enabled: bool = Field(default=False, description="run the warm-up before iteration 0 (once "
                          "per training run: a resumed run does not redo it)")
    rank: Literal["plan_mean", "run"] = Field(
        default="plan_mean", description="plan_mean: a task's runs grouped by plan (each step's "
        "agent and which earlier steps it sees, not the subtasks' wording), each plan scored by "
        "its mean reward over all its runs, right and wrong (then more runs, then cheaper), and "
        "the best plan's best run trained on; run: the best runs by their own reward, then "
        "cost (one lucky run of a cheap plan outranks a plan that is right nine times in ten)")
    more_steps_margin: float = Field(
        default=0.0, ge=0.0, le=1.0, description="rank plan_mean: a plan of more steps is "
        "trained on only if its mean reward beats the best plan of fewer steps by more than "
        "this (rewards run 0 to 1), else the plan of fewer steps is; 0: the best mean alone. A "
        "second step that adds nothing is a near tie, and among many candidates one such "
        "plan's noisy mean beats the plain plan's by luck")
    ties_within_se: float = Field(
        default=0.0, ge=0.0, le=4.0, description="rank plan_mean: two plans whose mean rewards "
        "differ by at most this many standard errors of the difference (a mean's error: its "
        "runs' standard deviation over the root of their number, 0.5 with one run) are a tie, "
        "and the cheaper by mean cost ranks first; applied before more_steps_margin; 0: "
        "only equal means tie. Among many candidates the best noisy mean is often a near tie "
        "that costs several times as much, and the reward's cost penalty is too small to "
        "break it")
    plan_means_by: Literal["task", "tag"] = Field(
        default="task", description="rank plan_mean: 'task' ranks a task's plans by their mean "
        "over that task's runs alone; 'tag' by their mean over the runs of every training task "
        "that shares the task's first tag (untagged tasks form one group, as the held-out split "
        "does), so the tasks of one kind learn the plan the kind's pooled runs rank first (the "
        "first of that order each task has a run to train on; fewer steps first by "
        "more_steps_margin on the pooled means) and rehearse the plans it ranks first (on a "
        "task whose conductor never wrote the kind's first plan, a sibling task's text of it, "
        "then learned under the task's own prompt): a "
        "task's own handful of runs is mostly luck, and a kind whose tasks learned different "
        "near-tied plans teaches held-out tasks of that kind whichever one they resemble")
    dead_steps: Literal["learn", "skip"] = Field(
        default="learn", description="'skip': a plan with a step whose output cannot reach the "
        "answer (a draft its last step does not see: engine/contracts/plans.py `dead_steps`) is "
        "neither learned nor rehearsed, though its runs count towards its mean; the plan "
        "without that step answers the same for less, and is learned where a conductor wrote "
        "it. 'learn': such a plan is ranked like any other, and its mean, on other draws than "
        "the plain plan's, can rank it first when the plain plan was never rehearsed")
    per_task: int = Field(default=1, ge=1, le=64, description="the best N of each training "
                          "task trained on: distinct plans (one run each) with rank plan_mean, "
                          "runs with rank run (best by reward, ties by the run's cost, cheaper "
                          "first, then the conductor's text, not the finishing order)")
    recent_runs: int = Field(default=256, ge=1, le=4096, description="rank plan_mean reads the "
                             "newest N scored runs of each training task")
    rehearse: int = Field(default=0, ge=0, le=64, description="before the warm-up, run each "
                          "training task's top `rehearse_plans` candidate plans this many more "
                          "times as fixed plans (scored and stored like any run; their rewards "
                          "count towards their plan's mean); 0: no rehearsal")
    rehearse_plans: int = Field(default=4, ge=0, le=16, description="candidate plans rehearsed "
                                "per training task, the best ranked first (a plan this run has "
                                "rehearsed before is not rehearsed again); 0: no rehearsal")
    rounds: int = Field(default=1, ge=1, le=8, description="rounds of expert iteration: each "
                        "samples (`samples`), rehearses, ranks every counted run so far and "
                        "fine-tunes the version the last round published, and publishes one")
    samples: int = Field(default=0, ge=0, le=64, description="exploring runs of each training "
                         "task at the start of each round, by the version the last round "
                         "published (the first round: the run's starting version); 0: none, "
                         "the warm-up reads only runs already stored")
    explore: float = Field(default=0.5, ge=0.0, le=1.0, description="the samples' share of "
                           "each decision drawn uniformly over its options ([rollouts] explore "
                           "for the warm-up's samples)")
    force_shapes: float = Field(default=0.0, ge=0.0, le=1.0, description="the share of each "
                                "task's samples (its last ones) whose plan shape is forced, "
                                "each multi-step shape in turn (the agents inside it sampled): "
                                "a shape the policy never writes gets candidates")
    force_agents: float = Field(default=0.0, ge=0.0, le=1.0, description="the share of each "
                                "task's samples (the ones before force_shapes' samples) whose "
                                "first step's agent is forced, each agent of the task's pool in "
                                "turn, in the pool's order (the rest of the plan sampled): every "
                                "agent gets runs of every task, so a task's best agent is "
                                "measured even where the policy and `explore` would rarely ask "
                                "it")
    min_reward: float = Field(default=0.0, ge=0.0, description="runs rewarded below this are "
                              "never trained on")
    correct_only: bool = Field(default=True, description="only runs whose verdict says the "
                               "answer was right (a wrong answer's plan teaches its mistakes)")
    conductors: list[str] | None = Field(
        default=None, description="only runs these conductors planned (their pool ids, as "
        "traces record the policy name: a strong API conductor's, to distil its plans); None: "
        "any conductor's, the policy's own exploring rollouts included")
    epochs: int = Field(default=3, ge=1, le=1000, description="passes over the selected plans")
    plans_per_step: int = Field(default=32, ge=1, description="plans per optimiser step (the "
                                "last step of an epoch takes what is left)")
    learning_rate: float = Field(default=1e-4, gt=0, description="AdamW's during the warm-up "
                                 "(the recipe's [loss] learning_rate is GRPO's)")
    learn: Literal["plan", "decisions"] = Field(
        default="plan", description="what of a selected plan's tokens the fine-tuning learns: "
        "'plan', all the model wrote (the subtasks' words too); 'decisions', only the plan "
        "grammar's choices (the first token of each agent's name, each access list, the `,` "
        "or `]` that adds or ends a step), the rest read as context: for agents that never "
        "read the words (a sim pool's), whose sampled words only add noise to what is learned. "
        "A plan with no recorded choices (an API conductor's) is learned whole")
    reward_weighted: bool = Field(default=False, description="weigh each plan's cross-entropy by "
                                  "its run's reward; false: every selected plan weighs 1 "
                                  "(rejection sampling)")

    @property
    def rehearses(self) -> bool:
        """Whether the training run rehearses candidate plans before the warm-up."""
        return self.enabled and self.rehearse > 0 and self.rehearse_plans > 0

    @property
    def samples_per_round(self) -> int:
        """Exploring runs of each training task the training run starts in each round."""
        return self.samples if self.enabled else 0

    def forced_samples(self) -> int:
        """How many of a task's samples (its last ones) have their shape forced."""
        return round(self.force_shapes * self.samples)

    def forced_agent_samples(self) -> int:
        """How many of a task's samples (the ones just before the shape-forced) have their first
        step's agent forced."""
        return round(self.force_agents * self.samples)

    def forced_agent(self, agents: Sequence[str], sample: int) -> str | None:
        """The agent sample `sample` of a task whose pool is `agents` has its first step forced
        to: each agent in turn over the `forced_agent_samples()` just before the shape-forced
        ones, None for any other sample."""
        last = self.samples - self.forced_samples()
        first = last - self.forced_agent_samples()
        if not agents or not first <= sample < last:
            return None
        return agents[(sample - first) % len(agents)]

    @model_validator(mode="after")
    def _forced_shares_fit(self) -> WarmupConfig:
        if self.force_shapes + self.force_agents > 1.0:
            raise ValueError(f"[warmup] force_shapes ({self.force_shapes}) and force_agents "
                             f"({self.force_agents}) share one task's samples: together at "
                             "most 1")
        return self

    @model_validator(mode="after")
    def _rehearsal_needs_plan_means(self) -> WarmupConfig:
        if self.rehearse and self.rehearse_plans and self.rank != "plan_mean":
            raise ValueError("[warmup] rehearse counts towards a plan's mean reward: set "
                             "rank = \"plan_mean\" or rehearse = 0")
        return self


Tracker = Literal["tensorboard", "trackio"]

# TRL's GRPOConfig names a recipe may give flat, at its top level as TRL takes them, and the
# section each belongs to (inside a section they are read as aliases of the section's fields).
TRL_SECTIONS: dict[str, str] = {
    "num_generations": "rollouts", "scale_rewards": "rollouts",
    "num_iterations": "loss", "per_device_train_batch_size": "loss", "learning_rate": "loss",
    "beta": "loss", "epsilon": "loss", "epsilon_high": "loss", "max_grad_norm": "loss",
    "loss_type": "loss", "max_completion_length": "loss", "temperature": "loss",
    "mask_truncated_completions": "loss",
}


class Recipe(Strict):
    """Everything an update needs besides which version it starts from."""

    also_known = TRL_SECTIONS.keys()  # moved into their sections by _flat_trl_names

    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    rollouts: RolloutConfig = Field(default_factory=RolloutConfig)
    heldout: HeldOutConfig = Field(default_factory=HeldOutConfig)
    checkpoints: CheckpointConfig = Field(default_factory=CheckpointConfig)
    warmup: WarmupConfig = Field(default_factory=WarmupConfig)
    report_to: list[Tracker] = Field(
        default_factory=list,
        description="where the trainer logs each update's metrics and sample plans: "
        "tensorboard (data_dir/runs/NAME) and/or trackio; TRL's 'none' or one name work too",
    )
    seed: int = Field(
        default=0, ge=0, description="seeds torch for each update, with the version it trains "
        "from (never the update id, which holds a run id): the same rollouts give the same "
        "weights on every run (a LoRA's initialisation included)",
    )

    @field_validator("report_to", mode="before")
    @classmethod
    def _one_or_none(cls, value: Any) -> Any:
        """TRL's forms: one name, or 'none'."""
        if isinstance(value, str):
            return [] if value == "none" else [value]
        return value

    @model_validator(mode="before")
    @classmethod
    def _flat_trl_names(cls, data: Any) -> Any:
        """TRL's names given flat (`num_generations = 64` at the top, as GRPOConfig takes
        them) moved into their section; the same name at the top and in the section is an
        error."""
        if not isinstance(data, dict) or not any(k in TRL_SECTIONS for k in data):
            return data
        data = dict(data)
        for key in [k for k in data if k in TRL_SECTIONS]:
            section = TRL_SECTIONS[key]
            inner = data.get(section, {})
            if not isinstance(inner, dict):
                break  # the section's own error says what is wrong with it
            if key in inner:
                raise ValueError(f"{key} is given both at the top and in [{section}]: give one")
            data[section] = {**inner, key: data.pop(key)}
        return data


class UpdateRequest(BaseModel):
    """One GRPO update: train `name` from version `parent`, publish parent + 1."""

    name: str = Field(description="the policy: the conductor's pool id")
    parent: Version
    update_id: str = Field(description="idempotency key: a retry of a published update is a no-op")
    recipe: Recipe = Field(default_factory=Recipe)
    reference: Version | None = Field(
        default=None, description="the version the KL term (beta > 0) measures against: the one "
        "GRPO started from, the warm-up's, as TRL's reference is the SFT model its GRPO starts "
        "from; None: the frozen base")
    rehearsal_batch: str | None = Field(
        default=None, description="[rollouts] reward = 'plan_mean': the batch label of the "
        "training run's rehearsals (fixed-plan runs recorded under the policy `baseline`), "
        "counted towards their plans' means with the policy's own runs")


class StepMetrics(BaseModel):
    """What one update did: loss, grad norm, clip fraction and KL are means over its optimiser
    steps; tokens counts the completion tokens in the loss once."""

    loss: float = 0.0
    grad_norm: float = 0.0
    clip_fraction: float = 0.0
    kl: float = 0.0
    tokens: int = 0
    samples: int = 0
    steps: int = Field(default=0, description="optimiser steps taken (steps_per_update)")
    seconds: float = 0.0
    sample_tokens: int = Field(default=0, description="prompt and completion tokens of the "
                               "samples the steps ran (each once)")
    passed_tokens: int = Field(default=0, description="tokens the transformer's passes ran over, "
                               "all steps together (padding included, a shared prefix once)")
    skipped: str | None = Field(default=None, description="why no step was taken, if none")


class UpdateResult(BaseModel):
    """The version an update published (or why it published none)."""

    name: str
    version: Version = Field(description="the newest version after this update")
    published: bool
    reason: str | None = None
    groups: int = 0
    rollouts: int = 0
    mean_reward: float | None = None
    valid_plan_rate: float | None = None
    rollout_tokens: int = 0
    left_out: dict[str, int] = Field(
        default_factory=dict,
        description="runs of the chosen groups not trained on, by reason (rewards/rollouts.py)")
    step: StepMetrics | None = None
    seconds: float = 0.0


class WarmupRequest(BaseModel):
    """The warm-up (Recipe.warmup): train `name` from version `parent` on the best scored runs
    of the training tasks, publish parent + 1."""

    name: str = Field(description="the policy: the conductor's pool id")
    parent: Version
    update_id: str = Field(description="idempotency key: a retry of a published warm-up is a "
                           "no-op (engine/contracts/names.py warmup_id)")
    recipe: Recipe = Field(default_factory=Recipe)
    task_ids: list[str] = Field(default_factory=list, description="the training tasks inline "
                                "(a run started with inline tasks)")
    task_list: TaskList | None = Field(default=None, description="the training tasks in the "
                                       "blob store; never the held-out ones")
    rehearsal_batch: str | None = Field(
        default=None, description="the batch of this run's rehearsals (fixed-plan runs of "
        "candidate plans): they count towards their plan's mean whoever `conductors` names")


class RehearsalPlans(BaseModel):
    """Each training task's candidate plans to rehearse, the best ranked first (the plan of
    each one's best conductor-written run, subtasks as that conductor wrote them)."""

    plans: dict[str, list[Plan]] = Field(default_factory=dict,
                                         description="by training task id")


class Rehearsal(BaseModel):
    """What the rehearsal before the warm-up ran: fixed-plan runs of candidate plans."""

    tasks: int = Field(default=0, description="training tasks with a candidate plan")
    plans: int = Field(default=0, description="candidate plans rehearsed")
    runs: int = Field(default=0, description="rehearsal runs scored")
    mean_reward: float | None = Field(default=None, description="of the scored runs")
    left_out: dict[str, int] = Field(default_factory=dict, description="rehearsal runs that "
                                     "scored nothing, by reason")
    seconds: float = 0.0


class WarmupSampling(BaseModel):
    """What a warm-up round's exploring samples ran: the policy's own runs of the training tasks."""

    runs: int = Field(default=0, description="samples scored")
    forced: int = Field(default=0, description="of them, with their plan shape forced")
    forced_agents: int = Field(default=0, description="of them, with their first step's agent "
                               "forced")
    mean_reward: float | None = Field(default=None, description="of the scored samples")
    left_out: dict[str, int] = Field(default_factory=dict, description="samples that scored "
                                     "nothing, by reason")
    tokens: int = Field(default=0, description="tokens the samples' runs used")
    seconds: float = 0.0


class WarmupResult(BaseModel):
    """What the warm-up (one round of it) trained on and published (or why it published
    nothing)."""

    name: str
    round: int = Field(default=0, description="the round (WarmupConfig.rounds), from 0")
    sampling: WarmupSampling | None = Field(default=None, description="the round's exploring "
                                            "samples, if the recipe asked for some")
    version: Version = Field(description="the newest version after the warm-up")
    published: bool
    reason: str | None = None
    tasks: int = Field(default=0, description="training tasks asked for")
    tasks_with_plans: int = Field(default=0, description="tasks with at least one plan selected")
    plans: int = Field(default=0, description="plans trained on")
    conductors: dict[str, int] = Field(default_factory=dict,
                                       description="plans by the conductor that wrote them")
    mean_reward: float | None = Field(default=None, description="of the selected runs")
    rank: Literal["plan_mean", "run"] = Field(default="run", description="how the runs were "
                                              "ranked (WarmupConfig.rank)")
    ranked_plans: int = Field(default=0, description="distinct plans ranked, all tasks together "
                              "(rank plan_mean)")
    counted_runs: int = Field(default=0, description="runs whose rewards the plan means count")
    mean_plan_reward: float | None = Field(
        default=None, description="the selected plans' mean rewards over their runs, averaged")
    shapes: dict[str, int] = Field(default_factory=dict, description="selected plans by shape "
                                   "(1 step, 2 steps (sees) ...)")
    rehearsal: Rehearsal | None = Field(default=None, description="the rehearsal before it, if "
                                        "the recipe asked for one")
    left_out: dict[str, int] = Field(default_factory=dict, description="candidate runs not "
                                     "trained on, by reason")
    logprob_before: float | None = Field(default=None, description="mean log-prob per trained "
                                         "token of the selected plans, before")
    logprob_after: float | None = Field(default=None, description="the same, after")
    step: StepMetrics | None = None
    seconds: float = 0.0


def group_agents(
    pool: Sequence[str], cfg: RolloutConfig, *, seed: int, name: str, iteration: int,
    task_id: str, sample: int = 0,
) -> list[str] | None:
    """The agents one rollout plans with (Task.agents), or None for the whole pool in its own
    order (the recipe varies nothing, or no pool is known).

    A subset of `pool` of a size in [pool_subset_min, pool_subset_max] (clamped to the pool),
    in the pool's order, or in a random one with `shuffle_pool`. With `vary_pool_per` 'group'
    every rollout of the group gets the same agents (`sample` is ignored); with 'rollout' the
    run `sample` of the group draws its own. The draw is a pure function of (recipe seed,
    training name, iteration, task id[, sample]), from SHA-256 rather than `random`, whose
    methods other than random() may change between Python versions: a replay, a rerun and a
    resumed run draw the same subsets on any worker."""
    if not cfg.varies_pool or not pool:
        return None
    parts: tuple[object, ...] = ("pool", seed, name, iteration, task_id)
    if cfg.vary_pool_per == "rollout":
        parts += (sample,)
    key = "\x1f".join(map(str, parts))

    def draw(*what: object) -> int:
        text = "\x1f".join(map(str, (key, *what)))
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")

    n = len(pool)
    hi = min(cfg.pool_subset_max or n, n)
    lo = min(cfg.pool_subset_min or (1 if cfg.pool_subset_max is not None else n), hi)
    size = lo + draw("size") % (hi - lo + 1)
    # the `size` agents of smallest draw: a uniform subset; their draw order, a uniform order
    ranked = sorted(pool, key=lambda agent: (draw("agent", agent), agent))
    chosen = ranked[:size]
    if cfg.shuffle_pool:
        return chosen
    picked = set(chosen)
    return [agent for agent in pool if agent in picked]


def split_heldout(tasks: Sequence[Task], fraction: float, seed: int = 0
                  ) -> tuple[list[Task], list[Task]]:
    """(train, held out): `fraction` of each tag's tasks (the first tag; untagged tasks form one
    group) held out, at least one of a group of two or more when the fraction is above 0, the
    choice a SHA-256 draw of (seed, task id) so the same file splits the same way on every
    machine. Stratified, so every kind of task is both trained on and evaluated."""
    if fraction <= 0:
        return list(tasks), []
    groups: dict[str, list[Task]] = {}
    for t in tasks:
        groups.setdefault(t.tags[0] if t.tags else "", []).append(t)
    held: set[str] = set()
    for members in groups.values():
        n = round(len(members) * fraction)
        if n == 0 and len(members) >= 2:
            n = 1
        n = min(n, len(members) - 1)
        ranked = sorted(members, key=lambda t: (hashlib.sha256(
            f"heldout\x1f{seed}\x1f{t.id}".encode()).digest(), t.id))
        held.update(t.id for t in ranked[:n])
    return [t for t in tasks if t.id not in held], [t for t in tasks if t.id in held]


def interleave_tags(tasks: Sequence[Task], seed: int = 0) -> list[Task]:
    """The tasks in a random order in which the tags take turns (the first tag of each; untagged
    tasks are one more kind): each tag's tasks shuffled, then dealt round-robin in a shuffled
    order of tags. An iteration takes the next k tasks (`pick_tasks`), so every iteration sees
    the kinds of task about evenly, and an update does not push the whole policy towards the one
    kind a plain shuffle happened to bunch together (which the next update, on another kind,
    undoes). Draws are SHA-256 of (seed, id), the same on every machine."""
    def key(*parts: object) -> bytes:
        return hashlib.sha256("\x1f".join(map(str, ("order", seed, *parts))).encode()).digest()

    kinds: dict[str, list[Task]] = {}
    for t in tasks:
        kinds.setdefault(t.tags[0] if t.tags else "", []).append(t)
    queues = [sorted(ts, key=lambda t: key("task", t.id)) for _, ts in
              sorted(kinds.items(), key=lambda kv: key("tag", kv[0]))]
    out: list[Task] = []
    for k in range(max((len(q) for q in queues), default=0)):
        out.extend(q[k] for q in queues if k < len(q))
    return out
