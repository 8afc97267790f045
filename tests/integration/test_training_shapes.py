"""Forced plan shapes in training, end to end on the real Temporal dev server and PostgreSQL: the
training workflow forces the last share of each group to every shape in turn, annealed, then
only where every unforced rollout failed; the local conductor (a one-layer policy with SmolLM2's
tokenizer, tests/tiny_policy.py) writes each forced shape."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Replayer, Worker

from conductor_engine.engine.contracts.names import UPDATE_ACTIVITY, training_workflow_id
from conductor_engine.engine.contracts.plan_shapes import (
    forced_shape,
    parse_shape,
    shape_of,
    shapes,
)
from conductor_engine.engine.contracts.traces import PolicyRef
from conductor_engine.engine.contracts.training import (
    LossConfig,
    Recipe,
    RolloutConfig,
    UpdateRequest,
    UpdateResult,
)
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.payloads import data_converter
from conductor_engine.engine.storage.trace_store import TraceStore
from conductor_engine.runtime.client import ConductorClient
from conductor_engine.workflows.train import (
    TrainingWorkflow,
    TrainInput,
    TrainProgress,
    rollout_draw,
)
from tests.conftest import running_worker
from tests.integration.test_training import sim_pool, sim_tasks
from tests.rollout_groups import read_groups


@activity.defn(name=UPDATE_ACTIVITY)
async def _stand_in(req: UpdateRequest) -> UpdateResult:
    """The update, stood in for: this test is about the rollouts."""
    return UpdateResult(name=req.name, version=req.parent, published=False, reason="stand-in")


@pytest.mark.slow
async def test_forced_shapes_anneal_then_rescue_only_groups_whose_unforced_rollouts_all_failed(
    client: Client, settings: Settings, tiny_policy_dir: Path, trace_store: TraceStore,
) -> None:
    """Two iterations of four groups of 4, half forced, annealed over one iteration: in the
    first, samples 2 and 3 of every group are forced to one step and to two steps seeing, and
    write those shapes; in the second, they are forced only in the groups where samples 0 and 1
    both failed, and the workflow's history replays."""
    pool = sim_pool(str(tiny_policy_dir), max_tokens=120)
    tasks = [t.model_copy(update={"id": f"{t.id}-{uuid.uuid4().hex[:6]}", "options":
                                  t.options.model_copy(update={"max_steps": 2})})
             for t in sim_tasks()]
    cfg = RolloutConfig(group_size=4, groups_per_update=len(tasks), credit="shape",
                        force_shapes=0.5, force_shapes_iterations=1)
    inp = TrainInput(name=f"shapes-{uuid.uuid4().hex[:6]}", policy=pool.conductor.id,
                     tasks=tasks, iterations=2, recipe=Recipe(rollouts=cfg, loss=LossConfig()),
                     trainer_task_queue=f"{settings.task_queue}-trainer")
    async with running_worker(client, settings, pool), Worker(
            client, task_queue=inp.trainer_task_queue, activities=[_stand_in]):
        await ConductorClient(client, settings).start_training(inp)
        handle = client.get_workflow_handle(training_workflow_id(inp.name),
                                            result_type=TrainProgress)
        await asyncio.wait_for(handle.result(), timeout=600)
        history = await handle.fetch_history()

    groups = await read_groups(trace_store, PolicyRef(name=pool.conductor.id, version="base"),
                               size=8, limit=len(tasks), task_ids=[t.id for t in tasks])
    assert len(groups) == len(tasks)
    rescued = 0
    for g in groups:
        by_run = {}
        for t in g.traces:
            iteration = int(t.workflow_id.split("/it")[1].split("/")[0])
            sample = int(t.workflow_id.rsplit("/", 1)[1])  # the rollout's place in its group
            # each iteration's rollouts draw afresh: rollout k of iteration i is sample 4i + k
            drawn = rollout_draw(iteration, sample, 4)
            assert t.task.sampling.sample == drawn == 4 * iteration + sample
            by_run[iteration, sample] = t
        assert len(by_run) == 8, sorted(by_run)
        for sample in range(4):  # the first iteration: the last two forced, in turn
            t = by_run[0, sample]
            want = forced_shape(2, sample, 4, 2)
            assert t.task.sampling.force_shape == (None if want is None else ",".join(want))
            if want is not None:
                assert shape_of(t.rounds[0].attempts[0].raw_text) == want
        failed = all(not (by_run[1, s].reward and by_run[1, s].reward.verdict
                          and by_run[1, s].reward.verdict.correct) for s in (0, 1))
        for sample in (2, 3):
            forced = by_run[1, sample].task.sampling.force_shape
            assert (forced is not None) == failed, (g.task_id, sample, forced)
            if forced is not None:
                assert parse_shape(forced) in shapes(2)
                rescued += 1
    print(f"{rescued // 2} of {len(groups)} groups rescued in the second iteration")
    await Replayer(workflows=[TrainingWorkflow], data_converter=data_converter(settings)
                   ).replay_workflow(history)
