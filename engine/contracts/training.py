"""The training recipe and the update activity's input and output, free of torch.

`TrainingWorkflow` carries these through Temporal, so they must import without torch: the
workflow runs on an ordinary engine worker; only the trainer service loads the model.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class RolloutConfig(BaseModel):
    """Which traces an update trains on."""

    group_size: int = Field(default=8, ge=2, description="G: rollouts per task in a group")
    groups_per_update: int = Field(default=4, ge=1, description="tasks per update")
    max_staleness: int = Field(
        default=1, ge=0, description="train on groups at most this many versions old"
    )
    stale_discount: float = Field(
        default=1.0, gt=0, le=1, description="advantage weight per version of age (1 = none)"
    )
    scale_rewards: bool = Field(
        default=True, description="divide advantages by the group's std (False = Dr. GRPO)"
    )
    dataset: str | None = Field(default=None, description="only groups of this dataset")
    task_ids: list[str] | None = Field(default=None, description="only these tasks")


class LossConfig(BaseModel):
    """The GRPO objective and optimiser step (names and meanings follow TRL's GRPOConfig)."""

    loss_type: Literal["grpo", "dr_grpo", "dapo"] = "dapo"
    epsilon_low: float = Field(default=0.2, ge=0)
    epsilon_high: float = Field(default=0.2, ge=0)
    beta: float = Field(default=0.0, ge=0, description="KL to the frozen base; 0 = no KL")
    mask_truncated: bool = Field(default=False, description="drop completions cut at max_tokens")
    max_completion_length: int = Field(default=512, gt=0, description="dr_grpo's normaliser")
    temperature: float = Field(default=1.0, gt=0, description="the rollouts' temperature")
    learning_rate: float = Field(default=1e-6, gt=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    micro_batch_size: int = Field(default=8, ge=1, description="gradient accumulation unit")
    steps_per_update: int = Field(
        default=1, ge=1,
        description="mu: optimiser steps on the same rollouts (TRL's num_iterations); past the "
        "first, the clipped ratio against the sampling policy keeps each step near it",
    )


class PolicyConfig(BaseModel):
    """The model being trained."""

    base: str = Field(
        default="smollm2-135m-instruct",
        description="a Hugging Face id, a local directory, or the engine's local default",
    )
    lora: bool = True
    lora_r: int = Field(default=16, ge=1)
    lora_alpha: int = Field(default=32, ge=1)
    lora_dropout: float = Field(default=0.0, ge=0, lt=1)
    lora_target_modules: str | list[str] = "all-linear"
    device: str | None = Field(default=None, description="None: cuda when present, else cpu")
    bf16: bool | None = Field(default=None, description="None: on where CUDA supports it")
    gradient_checkpointing: bool | None = Field(default=None, description="None: on GPU only")


class Recipe(BaseModel):
    """Everything an update needs besides which version it starts from."""

    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    rollouts: RolloutConfig = Field(default_factory=RolloutConfig)
    seed: int = Field(
        default=0, ge=0, description="seeds torch for each update, with the version it trains "
        "from (never the update id, which holds a run id): the same rollouts give the same "
        "weights on every run (a LoRA's initialisation included)",
    )


class UpdateRequest(BaseModel):
    """One GRPO update: train `name` from version `parent`, publish parent + 1."""

    name: str = Field(description="the policy: the conductor's pool id")
    parent: int = Field(ge=0)
    update_id: str = Field(description="idempotency key: a retry of a published update is a no-op")
    recipe: Recipe = Field(default_factory=Recipe)


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
    skipped: str | None = Field(default=None, description="why no step was taken, if none")


class UpdateResult(BaseModel):
    """The version an update published (or why it published none)."""

    name: str
    version: int = Field(description="the newest version after this update")
    published: bool
    reason: str | None = None
    groups: int = 0
    rollouts: int = 0
    mean_reward: float | None = None
    valid_plan_rate: float | None = None
    rollout_tokens: int = 0
    left_out: dict[str, int] = Field(
        default_factory=dict,
        description="runs of the chosen groups not trained on, by reason (contracts/rollouts.py)")
    step: StepMetrics | None = None
    seconds: float = 0.0
