"""History bytes: what a batch's or training run's children add to the parent's history, and
what a task list adds to a workflow input.

    python -m tests.benchmarks.bench_history_size [--children 32] [--output-kb 40]
        [--reasoning-kb 20] [--tasks 5000,20000]

Children. Every child is a conductor run whose plan reply carries `--reasoning-kb` of reasoning
before a 2-step plan, and whose agents answer `--output-kb` each (the whole RunResult, with the
plan's prompt, the outputs and the answer, stays under the 256 KiB payload threshold by default,
so history holds it inline; past the threshold the payload codec keeps a reference instead).
- engine: a BatchWorkflow of `--children` tasks
  (runtime.client.ConductorClient.submit_batch), each child
  returning its summary (RunResult.summary); and a training iteration of the same number of
  rollouts (the update a stand-in on its own trainer queue);
- baseline: a parent defined in this file that starts the same children as BatchWorkflow did
  before summaries (execute_child_workflow, the whole RunResult back), same window.
Printed: the parent's history in bytes (every run's events, serialised), per child, and the
ratio baseline / engine; a child's completion event, largest.

Inputs. For each N of `--tasks`, the BatchWorkflow input with the N tasks inline (what a client
sent before task lists, written again at every continue-as-new) against the input the client
sends now (a TaskList reference to chunks in the blob store), as JSON bytes, and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

from temporalio import activity, workflow
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.common import WorkflowIDReusePolicy
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from conductor_engine.engine.contracts.names import (
    UPDATE_ACTIVITY,
    batch_workflow_id,
    training_workflow_id,
)
from conductor_engine.engine.contracts.records import RunResult
from conductor_engine.engine.contracts.tasks import RunOptions, Task
from conductor_engine.engine.contracts.training import (
    Recipe,
    RolloutConfig,
    UpdateRequest,
    UpdateResult,
)
from conductor_engine.engine.storage.blobs import LocalBlobStore
from conductor_engine.engine.storage.shared_store import close_shared_stores
from conductor_engine.engine.storage.task_list_chunks import put_task_list
from conductor_engine.runtime.client import ConductorClient
from conductor_engine.runtime.worker import build_worker
from conductor_engine.workflows.batch import BatchInput
from conductor_engine.workflows.conduct import ConductWorkflow
from conductor_engine.workflows.train import TrainInput
from tests.benchmarks._harness import bench_pool, quiet_logs, run, stack, table

KB = 1024
AGENTS = ["a", "b"]


# ------------------------------------------------------------------------------ the baseline


@workflow.defn(name="BenchWholeResultsParent")
class WholeResultsParent:
    """BatchWorkflow's window as it was before summaries: at most `concurrency` children at
    once, each started with execute_child_workflow and returning its whole RunResult. (Run
    outside the sandbox: history bytes do not depend on it.)"""

    @workflow.run
    async def run(self, tasks: list[Task], concurrency: int, task_queue: str) -> int:
        slots = asyncio.Semaphore(concurrency)
        prefix = workflow.info().workflow_id

        async def child(task: Task) -> RunResult:
            async with slots:
                return await workflow.execute_child_workflow(
                    ConductWorkflow.run, task, id=f"{prefix}/{task.id}", task_queue=task_queue,
                    id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
                    static_summary=f"{prefix} · {task.question[:150]}",
                )

        results = await asyncio.gather(*(child(t) for t in tasks))
        return sum(1 for r in results if not r.summarized)


@activity.defn(name=UPDATE_ACTIVITY)
async def stand_in_update(req: UpdateRequest) -> UpdateResult:
    return UpdateResult(name=req.name, version=req.parent, published=False, reason="stand-in")


# ------------------------------------------------------------------------------ measuring


async def history(client: Client, workflow_id: str) -> list[HistoryEvent]:
    """Every event of every run of `workflow_id` (a batch or training run continues as new)."""
    events: list[HistoryEvent] = []
    async for wf in client.list_workflows(f"WorkflowId = '{workflow_id}'"):
        handle = client.get_workflow_handle(wf.id, run_id=wf.run_id)
        events.extend([e async for e in handle.fetch_history_events()])
    return events


def sizes(events: list[HistoryEvent]) -> tuple[int, int, int]:
    """(history bytes, children completed, largest completion event bytes)."""
    done = [e.ByteSize() for e in events
            if e.HasField("child_workflow_execution_completed_event_attributes")]
    return sum(e.ByteSize() for e in events), len(done), max(done, default=0)


def tasks_for(prefix: str, n: int) -> list[Task]:
    return [Task(id=f"{prefix}-{i:05d}", question=f"Question {i}: what is {i} + 1?",
                 reference=str(i + 1), verifier="exact", options=RunOptions(max_plan_attempts=1))
            for i in range(n)]


async def children(args: argparse.Namespace) -> list[list[object]]:
    reasoning = "Let me think about which agent suits this. " * (args.reasoning_kb * KB // 44)
    output = "x" * (args.output_kb * KB)
    plan = ('{"steps": [{"agent": "a", "subtask": "Work it out.", "access": []}, '
            '{"agent": "b", "subtask": "State the answer.", "access": [0]}]}')
    rows: list[list[object]] = []
    with stack() as s:
        s.agents.set_responder("conductor", lambda _: reasoning + plan)
        for agent in AGENTS:
            s.agents.set_responder(agent, lambda _: output)
        client = await s.client()
        settings = s.queue("history")
        pool = bench_pool(s.agents.openai_base_url, AGENTS)
        conductor = ConductorClient(client, settings, pool)
        trainer_queue, parent_queue = f"{settings.task_queue}-trainer", f"{settings.task_queue}-b"
        n, window = args.children, args.concurrency
        async with (build_worker(client, settings, pool),
                    Worker(client, task_queue=trainer_queue, activities=[stand_in_update]),
                    Worker(client, task_queue=parent_queue, workflows=[WholeResultsParent],
                           workflow_runner=UnsandboxedWorkflowRunner())):
            name = f"hist-{uuid.uuid4().hex[:6]}"
            await conductor.submit_batch(name, tasks_for(name, n), concurrency=window,
                                         report=False)
            await client.get_workflow_handle(batch_workflow_id(name)).result()
            engine = sizes(await history(client, batch_workflow_id(name)))

            whole_id = f"whole-{uuid.uuid4().hex[:6]}"
            whole = await client.execute_workflow(
                WholeResultsParent.run, args=[tasks_for(whole_id, n), window,
                                              conductor.task_queue],
                id=whole_id, task_queue=parent_queue)
            assert whole == n, "every baseline child returned its whole result"
            baseline = sizes(await history(client, whole_id))

            train = f"hist-{uuid.uuid4().hex[:6]}"
            groups = 4
            await conductor.start_training(TrainInput(
                name=train, policy=pool.conductor.id, tasks=tasks_for(train, groups),
                iterations=1, concurrency=window, trainer_task_queue=trainer_queue,
                recipe=Recipe(rollouts=RolloutConfig(group_size=max(2, n // groups),
                                                     groups_per_update=groups))))
            await client.get_workflow_handle(training_workflow_id(train)).result()
            training = sizes(await history(client, training_workflow_id(train)))
        await close_shared_stores()
    for label, (total, done, largest) in (
            ("baseline: whole RunResults (as before)", baseline),
            ("engine: BatchWorkflow, summaries", engine),
            ("engine: TrainingWorkflow iteration, summaries", training)):
        rows.append([label, done, f"{total:,}", f"{total / max(done, 1):,.0f}",
                     f"{largest:,}"])
    ratio = (baseline[0] / baseline[1]) / (engine[0] / engine[1])
    rows.append(["baseline / engine, per child", "", "", f"{ratio:.1f}x", ""])
    return rows


async def inputs(args: argparse.Namespace) -> list[list[object]]:
    rows: list[list[object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        store = LocalBlobStore(Path(tmp))
        for n in args.tasks:
            tasks = [t.model_copy(update={"batch": "b"}) for t in tasks_for("in", n)]
            inline = len(BatchInput(name="b", tasks=tasks).model_dump_json())
            listed = await put_task_list(store, tasks)
            by_ref = len(BatchInput(name="b", task_list=listed).model_dump_json())
            per_task = statistics.fmean(len(t.model_dump_json()) for t in tasks)
            rows.append([f"{n:,}", len(listed.chunks), f"{inline:,}", f"{by_ref:,}",
                         f"{inline / by_ref:,.0f}x", f"{50 * KB * KB / per_task:,.0f}"])
    return rows


async def main(args: argparse.Namespace) -> int:
    quiet_logs("error")
    child_rows = await children(args)
    print(f"\nparent history, {args.children} children at concurrency {args.concurrency}; "
          f"each child: {args.reasoning_kb} KB of plan reasoning, 2 steps of "
          f"{args.output_kb} KB\n")
    print(table(["parent", "children", "history bytes", "bytes per child",
                 "largest completion event"], child_rows))
    input_rows = await inputs(args)
    print("\nBatchWorkflow input, tasks inline vs a task list reference (JSON bytes)\n")
    print(table(["tasks", "chunks", "inline", "reference", "inline / reference",
                 "tasks that fill 50 MiB inline"], input_rows))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--children", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--output-kb", type=int, default=40)
    parser.add_argument("--reasoning-kb", type=int, default=20)
    parser.add_argument("--tasks", type=lambda v: [int(x) for x in v.split(",")],
                        default=[5000, 20000])
    sys.exit(run(lambda: main(parser.parse_args())))
