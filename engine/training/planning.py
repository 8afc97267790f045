"""A training run planned from what `conductor train start` (or a Python caller) asks for.

`plan_training` turns TrainingOptions into a TrainingPlan: the recipe with the overrides
applied, the base model the trainer loads (`trained_base_model`), and the tasks interleaved by
tag and split into trained and held out. Every refusal is a one-line ValueError saying what to
do, raised before anything is written or started; the client then turns the plan into the
TrainingWorkflow's input (`ConductorClient.training_input`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import get_args

from pydantic import BaseModel, Field

from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.contracts.training import Recipe, interleave_tags, split_heldout
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.providers.registry import ProviderName, capabilities, listed


class TrainingOptions(BaseModel):
    """What starting (or resuming) training run `name` takes besides its tasks: a recipe and
    the overrides `conductor train start` offers on top of it (None: the recipe's own)."""

    name: str
    recipe: Recipe = Field(default_factory=Recipe)
    recipe_given: bool = Field(default=False, description="the recipe came from a file: its "
                               "base model and staleness are the user's, not defaults")
    base: str | None = Field(default=None, description="the model the conductor serves")
    iterations: int = 20
    group_size: int | None = None
    tasks_per_iteration: int | None = None
    learning_rate: float | None = None
    from_traces: bool = False
    concurrency: int = 64
    holdout: float | None = None
    eval_every: int | None = None
    seed: int = Field(default=0, description="shuffles the task order (the tags taking turns)")


class TrainingPlan(BaseModel):
    """A training run ready to start: its options, the recipe with the overrides applied, and
    the tasks split into those trained on and those held out."""

    options: TrainingOptions
    recipe: Recipe
    tasks: list[Task]
    heldout: list[Task]


def plan_training(opts: TrainingOptions, pool: Pool, tasks: Sequence[Task]) -> TrainingPlan:
    """The recipe with `opts`' overrides and the tasks, interleaved by tag and split into
    trained and held out. ValueError (one line, what to do) for a base model the conductor
    cannot be trained from, or a held-out share that holds nothing out."""
    r = opts.recipe.model_copy(deep=True)
    r.policy.base = trained_base_model(pool, opts.base or (r.policy.base if opts.recipe_given
                                                            else None))
    if opts.group_size is not None:
        r.rollouts.group_size = opts.group_size
    if opts.tasks_per_iteration is not None:
        r.rollouts.groups_per_update = opts.tasks_per_iteration
    if opts.learning_rate is not None:
        r.loss.learning_rate = opts.learning_rate
    if opts.from_traces and not opts.recipe_given:
        r.rollouts.max_staleness = 1_000_000  # every stored version's groups are fair game
    if opts.holdout is not None:
        r.heldout.fraction = opts.holdout
    if opts.eval_every is not None:
        r.heldout.every = opts.eval_every
    needs_sampler = {"explore": "the sampler explores and records the mixture's log-probs",
                     "force_shapes": "its sampler forces the shape"}
    for key, why in needs_sampler.items():
        value = getattr(r.rollouts, key)
        if value and not opts.from_traces and not capabilities(pool.conductor.provider).explores:
            raise ValueError(f"the recipe's [rollouts] {key} = {value} needs a local conductor "
                             f"({why}); {pool.conductor.id!r} runs on "
                             f"{pool.conductor.provider}: set {key} = 0")
    w = r.warmup
    if (w.samples_per_round and w.force_agents and not opts.from_traces
            and not capabilities(pool.conductor.provider).explores):
        raise ValueError(f"the recipe's [warmup] force_agents = {w.force_agents} needs a local "
                         "conductor (its sampler forces the first step's agent); "
                         f"{pool.conductor.id!r} runs on {pool.conductor.provider}: set "
                         "force_agents = 0")
    train, heldout = interleave_tags(tasks, opts.seed), list[Task]()
    if train and r.heldout.fraction > 0 and not opts.from_traces:
        train, heldout = split_heldout(train, r.heldout.fraction, r.heldout.seed)
        if not heldout:
            raise ValueError(f"--holdout {r.heldout.fraction}: no task could be held out of "
                             f"{len(train)} (each tag needs at least two tasks)")
    return TrainingPlan(options=opts, recipe=r, tasks=train, heldout=heldout)


def trained_base_model(pool: Pool, given: str | None) -> str:
    """What the trainer loads: the conductor's own model for a local conductor (the local
    provider applies each version to exactly that), else a Hugging Face id to give.
    ValueError (one line) when that cannot be."""
    conductor = pool.conductor
    serves = capabilities(conductor.provider).trained_versions
    if serves == "checkpoint":
        if given and given != conductor.model:
            raise ValueError(f"--base {given} differs from the conductor's model "
                             f"{conductor.model}; the {conductor.provider} provider applies "
                             f"trained versions to the conductor's model")
        return conductor.model
    if serves == "served":
        if not given:
            raise ValueError(f"the conductor {conductor.id!r} is served by "
                             f"{conductor.base_url}; give --base with the Hugging Face id or "
                             f"directory of the model it serves ({conductor.model}?)")
        return given
    trainable = [p for p in get_args(ProviderName) if capabilities(p).trained_versions]
    raise ValueError(f"the conductor {conductor.id!r} runs on {conductor.provider}, whose "
                     f"weights cannot be trained here; use a {listed(trainable, 'or')} "
                     f"conductor")
