"""Replay: recorded histories of ConductWorkflow must replay against the current code, so a
non-deterministic change (reordered activities, a new await, a changed child id) fails here
instead of breaking runs that are in flight in production.

Histories are named `<version>_<workflow>.json`. Keep old versions: runs started before a change
must still replay (the workflow guards changes with `workflow.patched`). Record a new version,
for a deliberate change only, with: python -m tests.integration.test_replay VERSION [NAME ...]
(only the histories NAME ..., when given).

The batch and training histories (`batch`, `batch_continued`, `train`) are a 6-task batch at
concurrency 2 continuing as new after 4 children (one child fails), and one training iteration
(the update a stand-in). v3's were recorded before task lists, child summaries and start waves
(the tasks inline in the input, whole results from the children); v4's with them.
`train_rehearsed` (v5) is a training iteration whose warm-up first rehearses one candidate plan of
each of two tasks twice, the trainer's activities stand-ins; `train_rounds` (v6) the last run
of a training run whose warm-up has two rounds of samples and rehearsals.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from temporalio import activity
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer, Worker

from conductor_engine.engine.contracts.names import (
    REHEARSAL_PLANS_ACTIVITY,
    UPDATE_ACTIVITY,
    WARMUP_ACTIVITY,
    batch_workflow_id,
    training_workflow_id,
)
from conductor_engine.engine.contracts.plans import Plan, Step
from conductor_engine.engine.contracts.tasks import RunOptions, Task
from conductor_engine.engine.contracts.training import (
    Recipe,
    RehearsalPlans,
    RolloutConfig,
    UpdateRequest,
    UpdateResult,
    WarmupConfig,
    WarmupRequest,
    WarmupResult,
)
from conductor_engine.engine.contracts.training_runs import TrainInput, TrainProgress
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.payloads import data_converter
from conductor_engine.runtime.client import ConductorClient
from conductor_engine.workflows.batch import BatchWorkflow
from conductor_engine.workflows.conduct import ConductWorkflow
from conductor_engine.workflows.train import TrainingWorkflow
from tests.agent_server import AgentServer, Reply
from tests.conftest import make_pool, running_worker
from tests.plans import plan_json

HISTORIES = Path(__file__).parent / "histories"


def _conductor(prompt: str) -> str:
    if "Task:\nGather the facts." in prompt:
        return plan_json(("gpt", "List the two numbers.", []))
    if "Your plan in round 1" in prompt:
        return '{"steps": []}'
    if "not a valid plan" not in prompt:
        return "no plan here"  # the first attempt fails to parse, and is recorded
    return plan_json(("conductor", "Gather the facts.", []), ("claude", "Compute 2^10.", []),
                     ("gemini", "Compare and answer.", "all"))


async def record(
    client: Client, settings: Settings, server: AgentServer
) -> dict[str, WorkflowHistory]:
    """Run one workflow that exercises every path (a failed plan attempt, parallel steps, a
    self-call child, a refinement round ending in an empty plan) and return its histories."""
    server.set_responder("conductor", _conductor)
    server.script("gpt", [Reply.ok("1024 and 1000")])
    server.script("claude", [Reply.ok("1024")])
    server.script("gemini", [Reply.ok("2^10 is larger")])
    conductor = ConductorClient(client, settings)
    task = Task(id="replay", question="Which is larger, 2^10 or 10^3?", reference="2^10",
                verifier="exact", options=RunOptions(refinement_rounds=1))
    async with running_worker(client, settings, make_pool(server)):
        wid = await conductor.submit(task, workflow_id=f"replay-{settings.task_queue}")
        res = await conductor.result(wid)
    assert res.answer == "2^10 is larger" and res.steps[0].child_workflow_id
    out = {}
    for name, workflow_id in (("conduct", wid), ("conduct_child", res.steps[0].child_workflow_id)):
        out[name] = await client.get_workflow_handle(workflow_id).fetch_history()
    return out


@activity.defn(name=UPDATE_ACTIVITY)
async def stand_in_update(req: UpdateRequest) -> UpdateResult:
    return UpdateResult(name=req.name, version=req.parent, published=False, reason="stand-in")


@activity.defn(name=REHEARSAL_PLANS_ACTIVITY)
async def stand_in_rehearsal_plans(req: WarmupRequest) -> RehearsalPlans:
    return RehearsalPlans(plans={t: [Plan(steps=[Step(agent="gpt", subtask="Answer it.",
                                                      access=[])])] for t in ("t0", "t1")})


@activity.defn(name=WARMUP_ACTIVITY)
async def stand_in_warmup(req: WarmupRequest) -> WarmupResult:
    return WarmupResult(name=req.name, version=req.parent, published=False, reason="stand-in")


async def _warm_up_run(
    client: Client, settings: Settings, server: AgentServer, suffix: str, warmup: WarmupConfig
) -> tuple[TrainProgress, WorkflowHistory]:
    """A one-iteration training run of two tasks whose recipe warms up with `warmup` (the
    trainer's activities stand-ins): its progress, and the history of its last run."""
    server.set_responder("conductor", lambda p: plan_json(("gpt", "Answer it.", [])))
    server.set_responder("gpt", _overloaded_for_3)
    conductor = ConductorClient(client, settings)
    opts = RunOptions(max_step_attempts=1, max_plan_attempts=1)
    tasks = [Task(id=f"t{i}", question=f"Compute {i} + 1.", reference=str(i + 1),
                  verifier="exact", options=opts) for i in range(2)]
    pool = make_pool(server, conductor={"id": f"replay-{settings.task_queue}-{suffix}"})
    trainer_queue = f"{settings.task_queue}-trainer-{suffix}"
    name = f"replay-{settings.task_queue}-{suffix}"
    async with running_worker(client, settings, pool), Worker(
            client, task_queue=trainer_queue,
            activities=[stand_in_update, stand_in_rehearsal_plans, stand_in_warmup]):
        await conductor.start_training(TrainInput(
            name=name, policy=pool.conductor.id, tasks=tasks, iterations=1, concurrency=3,
            trainer_task_queue=trainer_queue,
            recipe=Recipe(rollouts=RolloutConfig(group_size=2, groups_per_update=2),
                          warmup=warmup)))
        handle = client.get_workflow_handle(training_workflow_id(name), result_type=TrainProgress)
        progress = await handle.result()
    return progress, await handle.fetch_history()


async def record_rehearsed(
    client: Client, settings: Settings, server: AgentServer
) -> dict[str, WorkflowHistory]:
    """A training iteration whose warm-up rehearses one candidate plan of each of two tasks
    twice: its history."""
    progress, history = await _warm_up_run(
        client, settings, server, "r", WarmupConfig(enabled=True, rehearse=2, rehearse_plans=1))
    assert progress.warmup is not None and progress.warmup.rehearsal is not None
    assert progress.warmup.rehearsal.runs + sum(progress.warmup.rehearsal.left_out.values()) == 4
    return {"train_rehearsed": history}


async def record_rounds(
    client: Client, settings: Settings, server: AgentServer
) -> dict[str, WorkflowHistory]:
    """A training run whose warm-up has two rounds, each sampling both tasks twice and
    rehearsing one candidate plan once: the history of its last run (round 1 and the
    iteration; round 0 continued as new)."""
    progress, history = await _warm_up_run(
        client, settings, server, "w",
        WarmupConfig(enabled=True, rounds=2, samples=2, rehearse=1, rehearse_plans=1))
    assert [w.round for w in progress.warmup_rounds] == [0, 1]
    assert all(w.sampling is not None and w.sampling.runs + sum(w.sampling.left_out.values())
               == 4 for w in progress.warmup_rounds)
    return {"train_rounds": history}


def _overloaded_for_3(prompt: str) -> Reply:
    return Reply.error(500, "overloaded") if "Compute 3 + 1" in prompt else Reply.ok("4")


async def record_parents(
    client: Client, settings: Settings, server: AgentServer
) -> dict[str, WorkflowHistory]:
    """A batch that continues as new (one child fails) and a training iteration; every run's
    history."""
    server.set_responder("conductor", lambda p: plan_json(("gpt", "Answer it.", [])))
    server.set_responder("gpt", _overloaded_for_3)
    conductor = ConductorClient(client, settings)
    opts = RunOptions(max_step_attempts=1, max_plan_attempts=1)
    tasks = [Task(id=f"t{i}", question=f"Compute {i} + 1.", reference=str(i + 1),
                  verifier="exact", options=opts) for i in range(6)]
    pool = make_pool(server, conductor={"id": f"replay-{settings.task_queue}"})
    trainer_queue = f"{settings.task_queue}-trainer"
    name = f"replay-{settings.task_queue}"
    async with running_worker(client, settings, pool), Worker(
            client, task_queue=trainer_queue, activities=[stand_in_update]):
        await conductor.submit_batch(name, tasks, concurrency=2, children_per_run=4)
        await client.get_workflow_handle(batch_workflow_id(name)).result()
        await conductor.start_training(TrainInput(
            name=name, policy=pool.conductor.id, tasks=tasks[:2], iterations=1, concurrency=3,
            trainer_task_queue=trainer_queue,
            recipe=Recipe(rollouts=RolloutConfig(group_size=2, groups_per_update=2))))
        await client.get_workflow_handle(training_workflow_id(name)).result()
    out = {}
    for label, workflow_id in (("batch", batch_workflow_id(name)),
                               ("train", training_workflow_id(name))):
        runs = sorted([(wf.start_time, wf.run_id) async for wf in
                       client.list_workflows(f"WorkflowId = '{workflow_id}'")])
        for n, (_, run_id) in enumerate(runs):
            handle = client.get_workflow_handle(workflow_id, run_id=run_id)
            out[label + ("_continued" if n else "")] = await handle.fetch_history()
    return out


def _replayer(settings: Settings) -> Replayer:
    return Replayer(workflows=[ConductWorkflow, BatchWorkflow, TrainingWorkflow],
                    data_converter=data_converter(settings))


async def test_recorded_histories_replay_on_the_current_workflow_code(tmp_path: Path) -> None:
    files = sorted(HISTORIES.glob("*.json"))
    assert files, "no recorded histories; run python -m tests.integration.test_replay"
    assert {f.stem.split("_", 1)[1] for f in files} >= {"batch", "batch_continued", "train"}
    # the engine's converter, as every worker uses it (these histories hold no blob references)
    replayer = _replayer(Settings(data_dir=tmp_path))
    for path in files:
        saved = json.loads(path.read_text())
        history = WorkflowHistory.from_json(saved["workflow_id"], saved["history"])
        await replayer.replay_workflow(history)


async def test_a_fresh_run_replays_too(
    agent_server: AgentServer, client: Client, settings: Settings
) -> None:
    histories = await record(client, settings, agent_server)
    histories |= await record_parents(client, settings, agent_server)
    histories |= await record_rehearsed(client, settings, agent_server)
    histories |= await record_rounds(client, settings, agent_server)
    assert set(histories) == {"conduct", "conduct_child", "batch", "batch_continued", "train",
                              "train_rehearsed", "train_rounds"}
    replayer = _replayer(settings)
    for history in histories.values():
        await replayer.replay_workflow(history)


async def _main(version: str, only: list[str]) -> None:  # pragma: no cover - re-recording
    import os
    import tempfile

    from conductor_engine.engine.storage.database import EmbeddedPostgres
    from conductor_engine.runtime.client import connect_temporal
    from conductor_engine.runtime.embedded import EmbeddedTemporal
    from tests.agent_server import start_agent_server
    from tests.conftest import free_port

    for name in ("TEST_OPENAI_KEY", "TEST_ANTHROPIC_KEY", "TEST_GEMINI_KEY"):
        os.environ[name] = "sk-test-key"
    with tempfile.TemporaryDirectory() as tmp, start_agent_server() as server:
        Path(tmp).chmod(0o711)  # run as root, the embedded PostgreSQL's own user must enter it
        temporal = EmbeddedTemporal(Path(tmp), free_port(), free_port())
        temporal.start(detached=False)
        postgres = EmbeddedPostgres(Path(tmp))
        try:
            settings = Settings(temporal_address=f"127.0.0.1:{temporal.port}", task_queue="replay",
                                data_dir=Path(tmp), database_url=postgres.start())
            client = await connect_temporal(settings, start_embedded=False)
            histories = await record(client, settings, server)
            histories |= await record_parents(client, settings, server)
            histories |= await record_rehearsed(client, settings, server)
            histories |= await record_rounds(client, settings, server)
            for name, history in histories.items():
                if only and name not in only:
                    continue
                saved = {"workflow_id": history.workflow_id,
                         "history": json.loads(history.to_json())}
                (HISTORIES / f"{version}_{name}.json").write_text(json.dumps(saved, indent=1))
                print(f"recorded {version}_{name}")
        finally:
            from conductor_engine.engine.storage.shared_store import close_shared_stores

            await close_shared_stores()
            temporal.stop()
            postgres.stop()


if __name__ == "__main__":
    import sys

    asyncio.run(_main(sys.argv[1], sys.argv[2:]))
