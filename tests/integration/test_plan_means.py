"""`[rollouts] reward = "plan_mean"` through the real stack: the trainer credits each rollout with
its plan's mean over the training run's stored runs of its task, read from PostgreSQL."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from pathlib import Path

from temporalio.client import Client

from conductor_engine.engine.contracts.names import rehearsal_batch, training_workflow_id
from conductor_engine.engine.contracts.plans import Plan, Step
from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.contracts.tasks import RunOptions, Task
from conductor_engine.engine.contracts.training import (
    LossConfig,
    PolicyConfig,
    Recipe,
    RolloutConfig,
)
from conductor_engine.engine.contracts.training_runs import TrainInput, TrainProgress
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.policies import PolicyRegistry
from conductor_engine.engine.storage.trace_store import TraceStore
from tests.agent_server import AgentServer
from tests.conftest import make_pool
from tests.integration.test_training import trainer_settings, training_stack
from tests.plans import plan_json

EARLIER = 8


async def test_an_update_credits_each_rollout_with_its_plan_s_mean_over_the_stored_runs(
    client: Client, settings: Settings, agent_server: AgentServer, tiny_policy_dir: Path,
    trace_store: TraceStore,
) -> None:
    """A conductor that sends its task to gpt and to claude in turn; gpt is right every other
    time, claude every time. Eight earlier runs of the task by the same conductor are stored
    (four of each plan), and two rehearsals of the claude plan in the training run's
    rehearsal batch (fixed plans, recorded under the policy `baseline`), then one iteration
    of a group of 4 (two of each). The update reads the task's runs: a gpt rollout's reward
    rests on 6 runs of its plan, a claude rollout's on 8 (the iteration's included), and the
    version's `plan_runs` is their mean, 7; the reported rollout reward stays the runs' own.
    A fixed-plan run in another batch, and a store shared with other tests (other conductors,
    other tasks), add nothing. The training run is named apart from its policy, as
    `conductor train start` names them."""
    settings = trainer_settings(settings)
    turn, gpt = itertools.count(), itertools.count()
    agent_server.set_responder("conductor", lambda _: plan_json(
        ("gpt" if next(turn) % 2 == 0 else "claude", "Answer it.", [])))
    agent_server.set_responder("gpt", lambda _: "42" if next(gpt) % 2 else "41")
    agent_server.set_responder("claude", lambda _: "42")
    pool = make_pool(agent_server, conductor={"id": f"cond-{uuid.uuid4().hex[:8]}"})
    task = Task(id=f"pm-{uuid.uuid4().hex[:6]}", question="What is 6 * 7?", reference="42",
                verifier="exact", options=RunOptions(max_plan_attempts=1))
    recipe = Recipe(policy=PolicyConfig(base=str(tiny_policy_dir), lora=False),
                    loss=LossConfig(learning_rate=1e-3, micro_batch_size=8),
                    rollouts=RolloutConfig(group_size=4, groups_per_update=1, max_staleness=0,
                                           reward="plan_mean"))
    inp = TrainInput(name=f"pm-{uuid.uuid4().hex[:6]}", policy=pool.conductor.id, tasks=[task],
                     iterations=1, recipe=recipe,
                     trainer_task_queue=settings.trainer_task_queue)
    async with training_stack(client, settings, pool) as conductor:
        for k in range(EARLIER):  # one at a time: the plans alternate in submission order
            wid = await conductor.submit(task, workflow_id=f"{inp.name}-early-{k}")
            await conductor.result(wid)
        claude = Plan(steps=[Step(agent="claude", subtask="Answer it.", access=[])])
        for k, batch in enumerate([rehearsal_batch(inp.name)] * 2 + ["rehearse-another-run"]):
            fixed = revised(task, batch=batch, options=revised(task.options, plan=claude))
            await conductor.result(await conductor.submit(
                fixed, workflow_id=f"{inp.name}-fixed-{k}"))
        await conductor.start_training(inp)
        final = await asyncio.wait_for(client.get_workflow_handle(
            training_workflow_id(inp.name), result_type=TrainProgress).result(), timeout=300)

    [it] = final.history
    assert it.published == "v1" and it.rollouts == 4, it
    version = await PolicyRegistry(trace_store.pool).get(pool.conductor.id, 1)
    assert version.metrics["plan_runs"] == 7, "gpt: 4 earlier + 2 now; claude: 2 more rehearsed"
    assert version.metrics["mean_reward"] == it.mean_reward, "the runs' own rewards, reported"
