"""The trainer service keeps its policy and optimiser across the updates of one training run:
the next update, whatever tasks it trains on and however its loss is set, starts from what it
holds, and holding gives exactly what reloading the published version would. Only a change of
the policy config (what the weights and the optimiser are built from) loads again.
A real tiny policy (tests/tiny_policy.py), real PostgreSQL, a real blob store."""

from __future__ import annotations

import uuid
from pathlib import Path

import torch

from conductor_engine.engine.contracts.training import (
    LossConfig,
    PolicyConfig,
    Recipe,
    RolloutConfig,
    UpdateRequest,
)
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.policies import PolicyRegistry
from conductor_engine.engine.storage.trace_store import TraceStore
from conductor_engine.trainer.service import Trainer
from tests.rollout_groups import write_groups

TASKS = ["hold-a", "hold-b", "hold-c", "hold-d", "hold-e"]


def recipe(tiny_policy_dir: Path, task: str, **loss: object) -> Recipe:
    """One group of one task per update; groups of older versions stay eligible (staleness)."""
    return Recipe(
        policy=PolicyConfig(base=str(tiny_policy_dir), lora=False, device="cpu"),
        loss=LossConfig.model_validate({"learning_rate": 1e-3, "micro_batch_size": 8, **loss}),
        rollouts=RolloutConfig(group_size=4, groups_per_update=1, max_staleness=10,
                               task_ids=[task]),
    )


async def test_the_next_update_keeps_the_held_policy_unless_the_policy_config_changes(
        base_settings: Settings, trace_store: TraceStore, tiny_policy_dir: Path) -> None:
    name = f"hold-{uuid.uuid4().hex[:6]}"
    await write_groups(trace_store, name, TASKS, group_size=4)
    settings = base_settings.model_copy(update={"trainer_task_queue": name})
    trainer = Trainer(settings)

    async def update(parent: int, r: Recipe) -> None:
        result = await trainer.update(UpdateRequest(
            name=name, parent=parent, update_id=f"{name}-{parent}", recipe=r))
        assert result.published and result.version == parent + 1, result

    await update(0, recipe(tiny_policy_dir, TASKS[0]))
    assert trainer.loads == 1
    # the training workflow's next iteration: other task ids, same model and optimiser
    await update(1, recipe(tiny_policy_dir, TASKS[1]))
    assert trainer.loads == 1, "an update with other task_ids reloaded the policy"

    # what it holds is exactly what a trainer loading v2 from the registry gets
    held = trainer._kept
    assert held is not None and held.version == 2
    fresh = Trainer(settings)
    reloaded = await fresh._hold(
        UpdateRequest(name=name, parent=2, update_id="-", recipe=recipe(tiny_policy_dir, "-")),
        PolicyRegistry(trace_store.pool), trace_store)
    assert fresh.loads == 1
    for a, b in zip(held.policy.model.parameters(), reloaded.policy.model.parameters(),
                    strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    ours, theirs = held.optimizer.state_dict(), reloaded.optimizer.state_dict()
    for i, per_param in ours["state"].items():
        for key, value in per_param.items():
            torch.testing.assert_close(value, theirs["state"][i][key], rtol=0, atol=0)

    # another loss (and learning rate): still held; the optimiser takes the recipe's rate
    await update(2, recipe(tiny_policy_dir, TASKS[2], learning_rate=5e-4, loss_type="grpo",
                           epsilon_high=0.28))
    assert trainer.loads == 1
    assert trainer._kept is not None
    assert {g["lr"] for g in trainer._kept.optimizer.param_groups} == {5e-4}

    # another policy config: the model is built differently, so it is loaded again
    changed = recipe(tiny_policy_dir, TASKS[3])
    changed.policy.gradient_checkpointing = True
    await update(3, changed)
    assert trainer.loads == 2
    # and held again from there on
    changed = recipe(tiny_policy_dir, TASKS[4])
    changed.policy.gradient_checkpointing = True
    await update(4, changed)
    assert trainer.loads == 2
