"""Planning a training run before it starts: the recipe with a command's overrides, the base
model the trainer loads, and the tasks split into trained and held out.

Torch-free and Temporal-free, so the client, the CLI and a test can plan a run (and refuse one
that cannot be trained, in one line) with no service running; it sits above the providers
because whether a conductor can be trained is a fact of its provider (`capabilities`)."""

from conductor_engine.engine.training.planning import (
    TrainingOptions,
    TrainingPlan,
    plan_training,
    trained_base_model,
)

__all__ = ["TrainingOptions", "TrainingPlan", "plan_training", "trained_base_model"]
