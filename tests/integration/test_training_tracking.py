"""Training tracked where ML people look: one training iteration through `conductor train
start`, with `report_to = "tensorboard"` in a recipe written in TRL's names, leaves a
TensorBoard event file in data_dir/runs/NAME whose scalars (read back with TensorBoard's own
EventAccumulator) are the iteration's reward, valid plan rate, loss, KL, clip fraction, grad
norm and tokens/s, with sample plans beside them."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.settings import Settings
from conductor_engine.runtime.client import ConductorClient
from tests.agent_server import AgentServer
from tests.cli import run_conductor, stack_env
from tests.conftest import make_pool, write_pool
from tests.plans import plan_json

# TRL's GRPOConfig names, flat, as a TRL user writes them
# (tests/unit/engine/contracts/test_recipe_trl_names.py)
RECIPE = """
report_to = "tensorboard"
learning_rate = 1e-3
per_device_train_batch_size = 8
num_generations = 4
scale_rewards = "none"

[policy]
base = "{base}"
lora = false

[rollouts]
groups_per_update = 2
max_staleness = 0
"""


async def test_an_iteration_leaves_its_metrics_and_sample_plans_for_tensorboard(
    client: Client, settings: Settings, agent_server: AgentServer, tiny_policy_dir: Path,
    tmp_path: Path,
) -> None:
    """`conductor train start` with a recipe in TRL's names, its worker and trainer in the
    command's process, then TensorBoard's own reader on what the trainer wrote."""
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator")
    answers = itertools.count()
    agent_server.set_responder("conductor", lambda _: plan_json(("gpt", "Answer it.", [])))
    agent_server.set_responder("gpt", lambda _: "42" if next(answers) % 2 else "41")
    pool = make_pool(agent_server, conductor={"id": f"cond-{uuid.uuid4().hex[:8]}"})
    tasks = [Task(id=f"track{i}-{uuid.uuid4().hex[:6]}", question=f"What is 40 + 2? ({i})",
                  reference="42", verifier="exact") for i in range(2)]
    (tmp_path / "tasks.jsonl").write_text(
        "".join(t.model_dump_json(exclude_defaults=True) + "\n" for t in tasks))
    (tmp_path / "recipe.toml").write_text(RECIPE.format(base=tiny_policy_dir))
    name = f"tracked-{uuid.uuid4().hex[:6]}"
    env = {**stack_env(settings, write_pool(pool, tmp_path / "pool.toml")),
           "CONDUCTOR_TRAINER_TASK_QUEUE": f"tr-{uuid.uuid4().hex[:8]}"}
    proc = await asyncio.to_thread(
        run_conductor, "train", "start", str(tmp_path / "tasks.jsonl"), "--name", name,
        "--recipe", str(tmp_path / "recipe.toml"), "--iterations", "1", "--worker",
        env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = settings.data_dir / "runs"
    assert f"TensorBoard: tensorboard --logdir {runs}" in proc.stderr, proc.stderr
    _, progress = await ConductorClient(client, settings).training_progress(name)
    assert progress is not None
    [it] = progress.history
    assert it.published == "v1" and it.loss is not None and it.mean_reward is not None
    assert it.rollouts == 8, "num_generations = 4 for each of the 2 tasks"

    run_dir = runs / name
    assert list(run_dir.glob("events.out.tfevents.*")), f"no event file in {run_dir}"
    events = event_accumulator.EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    events.Reload()
    scalars = {tag: events.Scalars(tag) for tag in events.Tags()["scalars"]}
    for tag in ("train/reward", "train/valid_plan_rate", "train/loss", "train/kl",
                "train/clip_fraction", "train/grad_norm", "train/tokens_per_s"):
        [point] = scalars[tag]
        assert point.step == 0, (tag, point)  # the iteration
    assert scalars["train/reward"][0].value == pytest.approx(it.mean_reward, abs=1e-6)
    assert scalars["train/loss"][0].value == pytest.approx(it.loss, abs=1e-6)
    assert scalars["train/grad_norm"][0].value == pytest.approx(it.grad_norm, abs=1e-6)
    assert scalars["train/learning_rate"][0].value == pytest.approx(1e-3)
    assert scalars["train/valid_plan_rate"][0].value == pytest.approx(1.0)
    assert scalars["train/tokens_per_s"][0].value > 0
    # a few sample plans, as the conductor wrote them, with their rewards
    [text] = events.Tensors("sample_plans/text_summary")
    shown = text.tensor_proto.string_val[0].decode()
    assert "reward" in shown and '"agent": "gpt"' in shown
    assert any(t.id in shown for t in tasks)
