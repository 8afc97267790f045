"""A training run's input and progress: what the client sends TrainingWorkflow
(workflows/train.py) and reads back from it (`conductor train status`), with each iteration's
figures and each held-out evaluation. All travel in the workflow's history as JSON (carried at
every continue-as-new), so a field is only ever added with a default: a run started before it
still reads."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, Field, model_validator

from conductor_engine.engine.contracts.limits import MAX_CONCURRENCY, recorded_concurrency
from conductor_engine.engine.contracts.names import TRAINER_TASK_QUEUE
from conductor_engine.engine.contracts.policy_versions import Version, version_label
from conductor_engine.engine.contracts.task_list_refs import TaskList
from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.contracts.training import Recipe, WarmupResult

Phase = Literal["starting", "warmup_samples", "rehearsal", "warmup", "rollouts", "update",
                "heldout", "stopped", "finished"]


class IterationStats(BaseModel):
    """One iteration: how the sampling version did, and what the update did."""

    iteration: int
    version: str = Field(description="the policy version that wrote the rollouts")
    rollouts: int = Field(default=0, description="runs that are rollouts (the figures below)")
    left_out: dict[str, int] = Field(
        default_factory=dict, description="this iteration's runs left out of their groups, by "
        "reason (from_traces: the update's)")
    update_left_out: dict[str, int] = Field(
        default_factory=dict, description="runs of the update's groups it did not train on, by "
        "reason (stale groups and unreadable traces included)")
    mean_reward: float | None = None
    valid_plan_rate: float | None = None
    tokens: int = 0
    published: str | None = Field(default=None, description="the version the update made")
    loss: float | None = None
    clip_fraction: float | None = None
    kl: float | None = None
    grad_norm: float | None = None
    trained_tokens: int = 0
    rollout_seconds: float = 0.0
    update_seconds: float = 0.0
    note: str | None = None


class HeldOutEval(BaseModel):
    """One version on the held-out tasks (Recipe.heldout): greedy by default, never trained on.
    Its runs are the batch `batch` (engine/contracts/names.py heldout_batch), so their traces
    can be read back for more than these figures (`conductor eval`'s report, routing)."""

    iteration: int = Field(description="iterations finished when this version was evaluated")
    version: str
    batch: str
    runs: int = Field(default=0, description="held-out runs that were scored")
    accuracy: float | None = Field(default=None, description="share answered right")
    mean_reward: float | None = None
    valid_plan_rate: float | None = None
    left_out: dict[str, int] = Field(
        default_factory=dict, description="runs not scored, by reason (infrastructure)")


class TrainProgress(BaseModel):
    """What `conductor train status` shows; carried across continue-as-new."""

    iteration: int = Field(default=0, description="iterations finished")
    version: Version = Field(default=0, description="the newest published version")
    phase: Phase = "starting"
    stop_requested: bool = False
    history: list[IterationStats] = Field(default_factory=list)
    evals: list[HeldOutEval] = Field(
        default_factory=list, description="held-out evaluations, the starting version first")
    warmup: WarmupResult | None = Field(
        default=None, description="the warm-up before iteration 0 (Recipe.warmup), once done: "
        "its last round")
    warmup_rounds: list[WarmupResult] = Field(
        default_factory=list, description="every round of the warm-up done so far, the first "
        "first")

    @property
    def label(self) -> str:
        """The newest version as traces and batch names write it ("base", "v3")."""
        return version_label(self.version)


class TrainInput(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    policy: str = Field(description="the conductor's pool id: the policy being trained")
    tasks: list[Task] = Field(
        default_factory=list, description="the tasks inline (older clients; small callers); "
        "used when given, else `task_list`")
    task_list: TaskList | None = Field(
        default=None, description="the tasks in the blob store (what the client sends)")
    iterations: int = Field(default=20, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0,
                               description="the rollouts' temperature: the recipe's [loss] "
                               "temperature when not given (see _rollouts_at_loss_temperature)")
    from_traces: bool = Field(default=False, description="train on stored traces, no rollouts")
    recipe: Recipe = Field(default_factory=Recipe)
    concurrency: Annotated[int, BeforeValidator(recorded_concurrency)] = Field(
        default=64, ge=1, le=MAX_CONCURRENCY,
        description="rollouts in flight at once; Temporal allows a workflow 2,000 pending "
        "children (engine/contracts/limits.py)")
    trainer_task_queue: str = TRAINER_TASK_QUEUE
    update_timeout_s: float = Field(default=6 * 3600.0, gt=0, description="one update attempt")
    update_heartbeat_s: float = Field(
        default=120.0, gt=0, description="a silent trainer is presumed dead after this long"
    )
    progress: TrainProgress = Field(default_factory=TrainProgress)
    heldout_tasks: list[Task] = Field(
        default_factory=list, description="held-out tasks inline (small callers); used when "
        "given, else `heldout_list`")
    heldout_list: TaskList | None = Field(
        default=None, description="the held-out tasks in the blob store: evaluated every "
        "recipe.heldout.every iterations, never trained on")
    agents: list[str] = Field(
        default_factory=list,
        description="the pool's agent ids (as Pool.available lists them, the conductor "
        "included when offered) that a recipe's random pool subsets are drawn from; the client "
        "fills it from its pool when training starts. A task that names its own `agents` "
        "draws from those instead",
    )

    @model_validator(mode="after")
    def _rollouts_at_loss_temperature(self) -> TrainInput:
        """The trainer scores each rollout's tokens at the recipe's `[loss] temperature` (TRL's
        `temperature`, its sampling temperature too), and divides by the log-probs the sampler
        recorded, so the rollouts take the recipe's temperature unless one is named. A caller
        naming another is refused when it starts (`temperature_error`); a history recorded
        before this rule still reads, and the trainer trains its mismatched runs on-policy
        (trainer/rollouts.group_samples)."""
        if "temperature" not in self.model_fields_set:
            self.temperature = self.recipe.loss.temperature
        return self

    def temperature_error(self) -> str | None:
        """Why these rollouts would be sampled at another temperature than the one the trainer
        scores them at, or None."""
        wanted = self.recipe.loss.temperature
        if self.from_traces or self.temperature == wanted:
            return None
        return (f"rollout temperature {self.temperature} differs from the recipe's [loss] "
                f"temperature {wanted}, at which the trainer scores the rollouts: set the "
                "recipe's temperature instead")
