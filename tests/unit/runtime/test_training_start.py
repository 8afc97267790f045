"""Starting a training run as it is planned (engine/training/planning.py `plan_training`):
the recipe with the command's overrides, the base model the trainer loads, and the held-out
split, with a one-line ValueError where the run cannot be trained. No service needed."""

from __future__ import annotations

import pytest

from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.contracts.training import Recipe
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.training import TrainingOptions, plan_training


def _pool(provider: str, **conductor: str) -> Pool:
    return Pool.model_validate({
        "conductor": {"id": "conductor", "provider": provider, "model": "tiny", **conductor},
        "agents": [{"id": "a", "provider": "openai-compatible", "model": "m",
                    "base_url": "http://127.0.0.1:9/v1"}]})


def _tasks(tags: int, per_tag: int) -> list[Task]:
    return [Task(id=f"t{t}-{i}", question=f"q{t}-{i}", tags=[f"tag{t}"])
            for t in range(tags) for i in range(per_tag)]


def test_the_command_overrides_land_in_the_recipe_and_the_base_is_the_local_model() -> None:
    plan = plan_training(TrainingOptions(name="r", group_size=3, tasks_per_iteration=2,
                                         learning_rate=1e-3, eval_every=7),
                         _pool("local"), _tasks(1, 4))
    r = plan.recipe
    assert (r.rollouts.group_size, r.rollouts.groups_per_update) == (3, 2)
    assert r.loss.learning_rate == 1e-3 and r.heldout.every == 7
    assert r.policy.base == "tiny", "a local conductor trains its own model"
    assert sorted(t.id for t in plan.tasks) == [f"t0-{i}" for i in range(4)] and not plan.heldout


def test_a_held_out_share_splits_each_tag_and_never_trains_on_what_it_holds_out() -> None:
    plan = plan_training(TrainingOptions(name="r", holdout=0.5), _pool("local"), _tasks(2, 4))
    assert plan.heldout and not {t.id for t in plan.tasks} & {t.id for t in plan.heldout}
    assert {t.tags[0] for t in plan.heldout} == {"tag0", "tag1"}


def test_a_held_out_share_that_holds_nothing_out_is_refused() -> None:
    with pytest.raises(ValueError, match="no task could be held out"):
        plan_training(TrainingOptions(name="r", holdout=0.1), _pool("local"), _tasks(3, 1))


def test_from_traces_without_a_recipe_takes_every_stored_version() -> None:
    recipe = Recipe()
    recipe.policy.base = "tiny"  # a recipe file's base: the conductor's own model
    given = TrainingOptions(name="r", from_traces=True, recipe=recipe, recipe_given=True)
    assert plan_training(given, _pool("local"), []).recipe.rollouts.max_staleness == \
        Recipe().rollouts.max_staleness
    default = TrainingOptions(name="r", from_traces=True)
    assert plan_training(default, _pool("local"), []).recipe.rollouts.max_staleness == 1_000_000


def test_a_served_conductor_needs_its_base_and_an_api_conductor_cannot_be_trained() -> None:
    served = _pool("openai-compatible", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match="give --base"):
        plan_training(TrainingOptions(name="r"), served, [])
    assert plan_training(TrainingOptions(name="r", base="org/m"), served, []).recipe.policy.base \
        == "org/m"
    with pytest.raises(ValueError, match="cannot be trained here"):
        plan_training(TrainingOptions(name="r"), _pool("openai", api_key_env="K"), [])


def test_an_exploring_recipe_is_refused_for_a_served_conductor_and_kept_for_a_local_one() -> None:
    """A served conductor samples without exploring (vLLM knows nothing of it), so a recipe
    that asks for it would train on rollouts it believes explored: refused, saying what to do."""
    recipe = Recipe()
    recipe.rollouts.explore = 0.25
    served = _pool("openai-compatible", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match=r"explore = 0.25 needs a local conductor.*set explore"):
        plan_training(TrainingOptions(name="r", base="org/m", recipe=recipe), served, [])
    plan = plan_training(TrainingOptions(name="r", recipe=recipe), _pool("local"), [])
    assert plan.recipe.rollouts.explore == 0.25


def test_a_warm_up_forcing_agents_is_refused_for_a_served_conductor_and_kept_for_a_local_one(
) -> None:
    """A served conductor's sampler cannot be made to ask an agent: a warm-up that believes
    its samples covered every agent would rank plans it never ran. Refused, saying what to do."""
    recipe = Recipe()
    recipe.warmup.enabled, recipe.warmup.samples, recipe.warmup.force_agents = True, 8, 0.5
    served = _pool("openai-compatible", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match=r"force_agents = 0.5 needs a local conductor.*set "
                       "force_agents = 0"):
        plan_training(TrainingOptions(name="r", base="org/m", recipe=recipe), served, [])
    plan = plan_training(TrainingOptions(name="r", recipe=recipe), _pool("local"), [])
    assert plan.recipe.warmup.force_agents == 0.5
