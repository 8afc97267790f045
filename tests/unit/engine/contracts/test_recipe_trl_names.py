"""A recipe written with TRL's GRPOConfig names reads as the same Recipe as one written with
ours (in sections, or flat as TRL takes them); a setting given under both names is an error."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest
from pydantic import ValidationError

from conductor_engine.engine.contracts.training import TRL_SECTIONS, LossConfig, Recipe
from tests.paths import ROOT

OURS = """
report_to = ["tensorboard"]
[loss]
loss_type = "dr_grpo"
epsilon_low = 0.2
epsilon_high = 0.28
beta = 0.04
mask_truncated = true
max_completion_length = 256
temperature = 0.9
learning_rate = 1e-5
max_grad_norm = 0.5
micro_batch_size = 4
steps_per_update = 2
[rollouts]
group_size = 16
scale_rewards = false
"""

TRL_IN_SECTIONS = """
report_to = "tensorboard"
[loss]
loss_type = "dr_grpo"
epsilon = 0.2
epsilon_high = 0.28
beta = 0.04
mask_truncated_completions = true
max_completion_length = 256
temperature = 0.9
learning_rate = 1e-5
max_grad_norm = 0.5
per_device_train_batch_size = 4
num_iterations = 2
[rollouts]
num_generations = 16
scale_rewards = "none"
"""

TRL_FLAT = """
report_to = ["tensorboard"]
loss_type = "dr_grpo"
epsilon = 0.2
epsilon_high = 0.28
beta = 0.04
mask_truncated_completions = true
max_completion_length = 256
temperature = 0.9
learning_rate = 1e-5
max_grad_norm = 0.5
per_device_train_batch_size = 4
num_iterations = 2
num_generations = 16
scale_rewards = "none"
"""


def load(text: str) -> Recipe:
    return Recipe.model_validate(tomllib.loads(text))


def test_trl_names_give_the_same_recipe_as_ours() -> None:
    ours = load(OURS)
    assert ours.loss.micro_batch_size == 4 and ours.rollouts.group_size == 16
    assert load(TRL_IN_SECTIONS) == ours
    assert load(TRL_FLAT) == ours
    # what travels in workflow inputs keeps our names
    assert "group_size" in ours.model_dump()["rollouts"]
    assert Recipe.model_validate(ours.model_dump()) == ours


def test_the_names_are_trls_own() -> None:
    """Every TRL name this module takes is a field of the installed TRL's GRPOConfig."""
    trl = pytest.importorskip("trl")
    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    assert set(TRL_SECTIONS) | {"report_to", "seed"} <= fields


def test_trl_epsilon_alone_clips_both_sides_as_in_trl() -> None:
    loss = LossConfig.model_validate({"epsilon": 0.3})
    assert loss.epsilon_low == loss.epsilon_high == 0.3


@pytest.mark.parametrize(("text", "message"), [
    ("[rollouts]\ngroup_size = 8\nnum_generations = 16",
     "group_size and num_generations name the same setting"),
    ("[loss]\nepsilon_low = 0.2\nepsilon = 0.3", "epsilon_low and epsilon name the same"),
    ("num_generations = 8\n[rollouts]\nnum_generations = 16",
     r"num_generations is given both at the top and in \[rollouts\]"),
    ("num_generations = 8\n[rollouts]\ngroup_size = 16",
     "group_size and num_generations name the same setting"),
    ("[rollouts]\nscale_rewards = 'batch'", "'batch'"),
    ("report_to = ['wandb']", "report_to"),
])
def test_a_setting_given_twice_or_unsupported_is_an_error(text: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        load(text)


def test_report_to_none_is_empty() -> None:
    assert load('report_to = "none"').report_to == []
    assert Recipe().report_to == []


def test_every_recipe_shipped_under_examples_reads() -> None:
    """A field renamed or a value out of range in a shipped recipe fails here, not in a
    user's first `conductor train start`."""
    root = ROOT / "examples"
    recipes = sorted(root.rglob("recipe*.toml"))
    assert recipes, "examples/sim/recipe.toml at least"
    for path in recipes:
        Recipe.model_validate(tomllib.loads(path.read_text(encoding="utf-8")))


def test_rollouts_are_sampled_at_the_temperature_the_trainer_scores_them_at() -> None:
    """TRL's `temperature` is its sampling temperature: a recipe that sets it gets rollouts at
    it, and a training input that names another one is refused when it starts (a history
    recorded before still reads), not trained with skewed importance ratios."""
    from conductor_engine.engine.contracts.training_runs import TrainInput

    recipe = Recipe.model_validate(tomllib.loads("[loss]\ntemperature = 1.4"))
    inp = TrainInput(name="t", policy="conductor", recipe=recipe)
    assert inp.temperature == 1.4
    assert TrainInput.model_validate_json(inp.model_dump_json()).temperature == 1.4, \
        "as a workflow history reads it back"
    assert TrainInput(name="t", policy="conductor").temperature == 1.0
    assert inp.temperature_error() is None
    named = TrainInput(name="t", policy="conductor", recipe=recipe, temperature=1.0)
    assert "set the recipe's temperature" in (named.temperature_error() or "")
    assert named.model_copy(update={"from_traces": True}).temperature_error() is None, \
        "no rollouts to sample"
    with pytest.raises(ValidationError, match="less than or equal to 2"):
        LossConfig(temperature=2.5)  # a conductor run cannot sample above 2
