"""Training tracked where ML people look: a training iteration with `report_to =
["tensorboard"]` leaves a TensorBoard event file in data_dir/runs/NAME whose scalars (read back
with TensorBoard's own EventAccumulator) are the iteration's reward, valid plan rate, loss, KL,
clip fraction, grad norm and tokens/s, with sample plans beside them."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

from conductor_engine.engine.contracts.names import training_workflow_id
from conductor_engine.engine.contracts.training import (
    LossConfig,
    PolicyConfig,
    Recipe,
    RolloutConfig,
)
from conductor_engine.engine.runtime.client import ConductorClient
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.tasks.model import Task
from conductor_engine.trainer.service import build_trainer_worker
from conductor_engine.workflows.train import TrainInput, TrainProgress
from tests.agent_server import AgentServer
from tests.conftest import make_pool, running_worker
from tests.plans import plan_json


async def test_an_iteration_leaves_its_metrics_and_sample_plans_for_tensorboard(
    client: Client, settings: Settings, agent_server: AgentServer, tiny_policy_dir: Path,
) -> None:
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator")
    settings = settings.model_copy(update={"trainer_task_queue": f"tr-{uuid.uuid4().hex[:8]}"})
    answers = itertools.count()
    agent_server.set_responder("conductor", lambda _: plan_json(("gpt", "Answer it.", [])))
    agent_server.set_responder("gpt", lambda _: "42" if next(answers) % 2 else "41")
    pool = make_pool(agent_server, conductor={"id": f"cond-{uuid.uuid4().hex[:8]}"})
    tasks = [Task(id=f"track{i}-{uuid.uuid4().hex[:6]}", question=f"What is 40 + {2 + 0 * i}?",
                  reference="42", verifier="exact") for i in range(2)]
    recipe = Recipe(policy=PolicyConfig(base=str(tiny_policy_dir), lora=False),
                    loss=LossConfig(learning_rate=1e-3, micro_batch_size=8),
                    rollouts=RolloutConfig(group_size=4, groups_per_update=2, max_staleness=0,
                                           scale_rewards=False),
                    report_to=["tensorboard"])
    inp = TrainInput(name=f"tracked-{uuid.uuid4().hex[:6]}", policy=pool.conductor.id,
                     tasks=tasks, iterations=1, recipe=recipe,
                     trainer_task_queue=settings.trainer_task_queue)
    async with running_worker(client, settings, pool), build_trainer_worker(client, settings):
        await ConductorClient(client, settings).start_training(inp)
        final = await asyncio.wait_for(client.get_workflow_handle(
            training_workflow_id(inp.name), result_type=TrainProgress).result(), timeout=300)
    [it] = final.history
    assert it.published == "v1" and it.loss is not None and it.mean_reward is not None

    run_dir = settings.data_dir / "runs" / inp.name
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
    assert scalars["train/valid_plan_rate"][0].value == pytest.approx(1.0)
    assert scalars["train/tokens_per_s"][0].value > 0
    # a few sample plans, as the conductor wrote them, with their rewards
    [text] = events.Tensors("sample_plans/text_summary")
    shown = text.tensor_proto.string_val[0].decode()
    assert tasks[0].id in shown and "reward" in shown and '"agent": "gpt"' in shown
