"""Temporal's limits hold by construction in the batch and training workflows, on the real
Temporal dev server, PostgreSQL and blob stores (engine/contracts/limits.py):

- concurrency is at most 2,000 (Temporal's default pending children per workflow) in the
  workflows' inputs, the client API (one clear line) and the CLI;
- a batch's or training run's child returns a summary of its run, so a child adds a few KB to
  its parent's history however long its prompts and outputs;
- a task list lives in the blob store in chunks, and the workflow input carries only a small
  reference to it, read a chunk at a time (across continue-as-new) by the `read_tasks` activity.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from temporalio import activity, workflow
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import TerminatedError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from conductor_engine.engine.contracts.batches import BatchInput, BatchProgress
from conductor_engine.engine.contracts.limits import (
    CHILD_SUMMARY_TEXT_CHARS,
    MAX_CONCURRENCY,
    TASKS_PER_CHUNK,
)
from conductor_engine.engine.contracts.names import (
    BATCH_WORKFLOW,
    READ_TASKS_ACTIVITY,
    UPDATE_ACTIVITY,
    batch_child_workflow_id,
    batch_workflow_id,
    training_workflow_id,
)
from conductor_engine.engine.contracts.records import RunResult
from conductor_engine.engine.contracts.rewards import Reward, Verdict
from conductor_engine.engine.contracts.task_list_refs import TaskList
from conductor_engine.engine.contracts.tasks import RunOptions, Task
from conductor_engine.engine.contracts.training import (
    Recipe,
    RolloutConfig,
    UpdateRequest,
    UpdateResult,
)
from conductor_engine.engine.contracts.training_runs import TrainInput, TrainProgress
from conductor_engine.engine.rewards.rollouts import left_out_reason
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.blobs import BlobCorrupt, BlobStore, LocalBlobStore, blob_store
from conductor_engine.engine.storage.payloads import data_converter
from conductor_engine.engine.storage.task_list_chunks import (
    ChunkCache,
    TaskListError,
    put_task_list,
    read_all,
    read_chunk,
)
from conductor_engine.runtime.client import ConductorClient, task_queue_of
from conductor_engine.runtime.history import step_trail
from conductor_engine.workflows.children import StartWaves, start_bytes
from conductor_engine.workflows.train import pick_ranges, pick_tasks
from tests.agent_server import AgentServer
from tests.blob_stores import fresh_bucket
from tests.cli import run_conductor
from tests.conftest import make_pool, running_worker
from tests.plans import plan_json

KB = 1024
CHILD_CLOSED = ("child_workflow_execution_completed_event_attributes",
                "child_workflow_execution_failed_event_attributes",
                "child_workflow_execution_canceled_event_attributes",
                "child_workflow_execution_timed_out_event_attributes",
                "child_workflow_execution_terminated_event_attributes",
                "start_child_workflow_execution_failed_event_attributes")


def _tasks(prefix: str, n: int, **fields: Any) -> list[Task]:
    return [Task(id=f"{prefix}-{i:05d}", question=f"Compute {i} + 1.", reference=str(i + 1),
                 verifier="exact", **fields) for i in range(n)]


async def _runs(client: Client, workflow_id: str) -> list[list[HistoryEvent]]:
    """The events of every run of a workflow (it continues as new), oldest run first."""
    runs = []
    async for wf in client.list_workflows(f"WorkflowId = '{workflow_id}'"):
        handle = client.get_workflow_handle(wf.id, run_id=wf.run_id)
        runs.append((wf.start_time, [e async for e in handle.fetch_history_events()]))
    return [events for _, events in sorted(runs, key=lambda r: r[0])]


def _input_bytes(events: list[HistoryEvent]) -> int:
    return events[0].workflow_execution_started_event_attributes.input.ByteSize()


def _max_pending_children(events: list[HistoryEvent]) -> int:
    """The most children the workflow had open at once, from its history."""
    pending = most = 0
    for e in events:
        if e.HasField("start_child_workflow_execution_initiated_event_attributes"):
            pending += 1
            most = max(most, pending)
        elif any(e.HasField(a) for a in CHILD_CLOSED):  # type: ignore[arg-type]
            pending -= 1
    return most


def _completions(events: list[HistoryEvent]) -> list[int]:
    """The bytes of each child's completion event."""
    return [e.ByteSize() for e in events
            if e.HasField("child_workflow_execution_completed_event_attributes")]


# --- concurrency: at most Temporal's 2,000 pending children --------------------------------------


def test_concurrency_over_temporals_pending_children_limit_is_refused_by_the_inputs() -> None:
    assert MAX_CONCURRENCY == 2000
    BatchInput(name="b", concurrency=MAX_CONCURRENCY)
    TrainInput(name="t", policy="p", concurrency=MAX_CONCURRENCY)
    for model, fields in ((BatchInput, {"name": "b"}), (TrainInput, {"name": "t", "policy": "p"})):
        with pytest.raises(ValidationError, match="less than or equal to 2000"):
            model(**fields, concurrency=MAX_CONCURRENCY + 1)
        with pytest.raises(ValidationError):
            model(**fields, concurrency=0)


async def test_an_input_recorded_before_the_bound_still_decodes_at_the_bound(
    settings: Settings,
) -> None:
    """A batch could be started with up to 10,000 and a training run with any concurrency: the
    inputs in their histories decode (at 2,000), so they go on instead of failing every
    workflow task; only values built in Python are refused."""
    converter = data_converter(settings)
    for model, old in ((BatchInput, {"name": "b", "tasks": [], "concurrency": 10_000}),
                       (TrainInput, {"name": "t", "policy": "p", "concurrency": 50_000})):
        [payload] = await converter.encode([old])
        [decoded] = await converter.decode([payload], [model])
        assert decoded.concurrency == MAX_CONCURRENCY


async def test_the_client_refuses_a_concurrency_over_the_limit_in_one_line(
    conductor: ConductorClient, settings: Settings,
) -> None:
    with pytest.raises(ValueError) as e:
        await conductor.submit_batch("too-many", _tasks("c", 3), concurrency=5000)
    message = str(e.value)
    assert "\n" not in message and "5000" in message and "2000" in message
    assert "limit.numPendingChildExecutions" in message
    # pydantic does not check an assignment: the client checks again what it sends
    inp = TrainInput(name="too-many", policy="p")
    inp.concurrency = 5000
    with pytest.raises(ValueError, match="concurrency 5000 is over 2000"):
        await conductor.start_training(inp)
    with pytest.raises(LookupError):  # nothing was started
        await conductor.batch_progress("too-many")


def test_the_cli_says_the_bound_in_its_help_and_refuses_more(tmp_path: Path) -> None:
    for command in (["batch"], ["train", "start"]):
        shown = run_conductor(*command, "--help")
        assert shown.returncode == 0, shown.stderr
        text = " ".join(shown.stdout.split())
        assert "1<=x<=2000" in text and "limit.numPendingChildExecutions" in text, text
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"question": "2 + 2?"}\n')
    for command in (["batch", str(tasks)], ["train", "start", str(tasks)]):
        refused = run_conductor(*command, "--concurrency", "2001")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "--concurrency" in refused.stderr and "2000" in refused.stderr


async def test_a_training_iteration_keeps_no_more_children_pending_than_its_concurrency(
    agent_server: AgentServer, client: Client, settings: Settings,
) -> None:
    """Two iterations of G=4 × 2 tasks (8 rollouts each) at concurrency 3. The tasks go to the
    blob store and the input carries only their reference (read again after continue-as-new,
    wrapping round the list of 3); each rollout returns a summary however long its outputs;
    and at no point are more than 3 children pending. The update is a stand-in on the trainer
    queue (what it trains is tested in test_training.py)."""
    long_output = "x" * (40 * KB)
    agent_server.set_responder("conductor", lambda p: plan_json(("gpt", "Answer it.", [])))
    agent_server.set_responder("gpt", lambda p: long_output)
    pool = make_pool(agent_server, conductor={"id": f"cond-{uuid.uuid4().hex[:8]}"})
    trainer_queue = f"trainer-{uuid.uuid4().hex[:8]}"
    updates: list[UpdateRequest] = []

    @activity.defn(name=UPDATE_ACTIVITY)
    async def update(req: UpdateRequest) -> UpdateResult:
        updates.append(req)
        return UpdateResult(name=req.name, version=req.parent, published=False,
                            reason="stand-in")

    tasks = _tasks(f"tl-{uuid.uuid4().hex[:4]}", 3, options=RunOptions(max_step_attempts=1))
    name = f"limits-{uuid.uuid4().hex[:6]}"
    inp = TrainInput(name=name, policy=pool.conductor.id, tasks=tasks, iterations=2,
                     concurrency=3, trainer_task_queue=trainer_queue,
                     recipe=Recipe(rollouts=RolloutConfig(group_size=4, groups_per_update=2)))
    async with running_worker(client, settings, pool), Worker(
            client, task_queue=trainer_queue, activities=[update]):
        await ConductorClient(client, settings).start_training(inp)
        final = await asyncio.wait_for(client.get_workflow_handle(
            training_workflow_id(name), result_type=TrainProgress).result(), timeout=180)

    assert [s.rollouts for s in final.history] == [8, 8]
    assert [u.recipe.rollouts.task_ids for u in updates] == [
        [tasks[0].id, tasks[1].id], [tasks[2].id, tasks[0].id]], "the next 2, wrapping round"
    runs = await _runs(client, training_workflow_id(name))
    assert len(runs) == 2
    for events in runs:
        assert _input_bytes(events) < 4 * KB, "a reference to the tasks, not the tasks"
        assert _max_pending_children(events) == 3
        completions = _completions(events)
        assert len(completions) == 8 and max(completions) < 3 * KB, completions
        reads = [e for e in events if e.HasField("activity_task_scheduled_event_attributes")
                 and e.activity_task_scheduled_event_attributes.activity_type.name
                 == READ_TASKS_ACTIVITY]
        assert 1 <= len(reads) <= 2


@workflow.defn(name="LimitsEchoChild")
class EchoChild:
    @workflow.run
    async def run(self, task: Task) -> str:
        return task.id


@workflow.defn(name="LimitsFanOut")
class FanOut:
    """`n` children with tasks of `size` characters, all wanted at once, as a batch's window or
    a training iteration's semaphore opens: through StartWaves, or (waves=False) as the
    workflows started them before."""

    @workflow.run
    async def run(self, n: int, size: int, waves: bool) -> int:
        starts = StartWaves(enabled=waves)

        async def one(i: int) -> str:
            task = Task(id=f"c{i}", question="q" * size)
            child = await starts.start(start_bytes(task), lambda: workflow.start_child_workflow(
                EchoChild.run, task, id=f"{workflow.info().workflow_id}/{i}"))
            return await child

        return len(await asyncio.gather(*(one(i) for i in range(n))))


async def test_children_start_in_waves_that_fit_in_a_workflow_task(client: Client) -> None:
    """300 children of 20 KB tasks (6 MB of start commands): at once, one workflow task would
    carry them all, over gRPC's 4 MiB, and the server terminates the workflow; in waves of at
    most 2 MiB, every child starts and completes."""
    queue = f"waves-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[FanOut, EchoChild],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        wid = f"waves-{uuid.uuid4().hex[:6]}"
        done = await asyncio.wait_for(client.execute_workflow(
            FanOut.run, args=[300, 20 * KB, True], id=wid, task_queue=queue), timeout=120)
        assert done == 300
        [events] = await _runs(client, wid)
        per_task, wave = [], 0
        for e in events:
            if e.HasField("start_child_workflow_execution_initiated_event_attributes"):
                wave += e.ByteSize()
            elif e.HasField("workflow_task_completed_event_attributes") and wave:
                per_task.append(wave)
                wave = 0
        per_task.append(wave)
        assert len([w for w in per_task if w]) >= 3 and max(per_task) < 2.5 * KB * KB, per_task
        assert not [e for e in events if e.HasField("workflow_task_failed_event_attributes")]

        at_once = f"at-once-{uuid.uuid4().hex[:6]}"
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(client.execute_workflow(
                FanOut.run, args=[300, 20 * KB, False], id=at_once, task_queue=queue),
                timeout=120)
        cause = failed.value.cause
        assert isinstance(cause, TerminatedError) and "GrpcMessageTooLarge" in str(cause)


# --- children return a summary ---------------------------------------------------------------


def _whole_run(size: int) -> RunResult:
    from conductor_engine.engine.contracts.agent_calls import Message
    from tests.traces import make_trace

    trace = make_trace("big")
    for s in trace.steps:
        s.output = "o" * size
    for r in trace.rounds:
        for a in r.attempts:
            a.raw_text = "r" * size
            a.prompt = [Message(role="system", content="s" * size),
                        Message(role="user", content="p" * size)]
            a.token_ids, a.logprobs = list(range(size // 8)), [-0.5] * (size // 8)
    return RunResult(task_id=trace.task.id, workflow_id=trace.workflow_id, run_id=trace.run_id,
                     status="completed", answer="a" * size, rounds=trace.rounds,
                     totals=trace.totals, reward=trace.reward)


def test_a_summary_is_a_few_kb_and_classifies_a_rollout_as_the_whole_run_does() -> None:
    whole = _whole_run(100 * KB)
    assert len(whole.model_dump_json()) > 400 * KB
    summary = whole.summary()
    assert len(summary.model_dump_json()) < 2 * KB
    assert summary.summarized and not summary.rounds and summary.totals == whole.totals
    assert summary.answer is not None and len(summary.answer) == CHILD_SUMMARY_TEXT_CHARS
    assert summary.answer.endswith("…") and whole.answer.startswith(summary.answer[:-1])

    def reward(details: dict[str, Any], reason: str = "judged") -> Reward:
        verdict = Verdict(verifier="code", correct=False, score=0.0, reason="r" * 10_000,
                          details=details)
        return Reward(value=0.5, verdict=verdict, reason=reason)

    cases = [reward({"error": "sandbox died " + "e" * 50_000, "output": ["x" * 9000] * 9}),
             reward({"trusted": False, "stdout": "y" * 50_000}),
             reward({}, reason="verifier error: " + "z" * 50_000),
             reward({"passed": 3, "total": 4, "log": "l" * 50_000})]
    for r in cases:
        run = whole.model_copy(update={"reward": r})
        small = run.summary()
        assert len(small.model_dump_json()) < 4 * KB
        assert left_out_reason(small.status, small.reward, small.failure) == \
            left_out_reason(run.status, run.reward, run.failure)
    failed = whole.model_copy(update={"status": "failed", "failure": "StepFailed",
                                      "error": "step 2 failed: " + "e" * 10_000})
    assert failed.summary().failure == "StepFailed"
    assert left_out_reason("failed", None, failed.summary().failure) == "step_failed"


async def test_a_batch_child_adds_a_few_kb_to_its_parents_history_and_its_result_stays_whole(
    agent_server: AgentServer, conductor: ConductorClient, client: Client, settings: Settings,
) -> None:
    """Each child's plan reply carries 30 KB of reasoning and its two steps answer 40 KB each
    (a whole result of about 190 KB, under the payload threshold, so history would hold it
    inline): the parent's history holds a summary of under 3 KB per child instead. The
    child's own result, through the client, is still the whole run."""
    reasoning, output = "Thinking. " * (3 * KB), "y" * (40 * KB)
    agent_server.set_responder("conductor", lambda p: reasoning + plan_json(
        ("gpt", "Work.", []), ("claude", "Answer.", [0])))
    agent_server.set_responder("gpt", lambda p: output)
    agent_server.set_responder("claude", lambda p: output)
    name = f"sum-{uuid.uuid4().hex[:6]}"
    tasks = _tasks(name, 6)
    async with running_worker(client, settings, make_pool(agent_server)):
        await conductor.submit_batch(name, tasks, concurrency=3, report=False)
        progress = await client.get_workflow_handle(
            batch_workflow_id(name), result_type=BatchProgress).result()
        whole = await conductor.result(batch_child_workflow_id(name, tasks[0].id))
    assert progress.completed == 6 and progress.scored == 6
    [events] = await _runs(client, batch_workflow_id(name))
    completions = _completions(events)
    assert len(completions) == 6 and max(completions) < 3 * KB, completions
    history_bytes = sum(e.ByteSize() for e in events)
    assert history_bytes / 6 < 8 * KB, f"{history_bytes / 6:.0f} bytes per child"
    assert not whole.summarized and whole.answer == output
    trail = await step_trail(client, batch_child_workflow_id(name, tasks[0].id))
    assert trail.answer == output, "`conductor history` shows the whole answer too"
    assert whole.rounds[0].attempts[0].raw_text.startswith(reasoning)
    [payload] = await data_converter(settings).encode([whole])
    assert payload.ByteSize() > 150 * KB, "what each completion would have held"


# --- task lists in the blob store --------------------------------------------------------------


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> BlobStore:
    if request.param == "local":
        return LocalBlobStore(tmp_path / "blobs")
    url = request.getfixturevalue("moto_url")
    settings = Settings(data_dir=tmp_path, s3_bucket=fresh_bucket(url, monkeypatch),
                        s3_endpoint_url=url, s3_region="us-east-1")
    return blob_store(settings)


async def test_a_task_list_is_stored_in_chunks_and_read_back_by_offset(store: BlobStore) -> None:
    """20,000 tasks: 40 chunks of 500, a reference of a few KB, and any slice read back as it
    was written; a chunk is bounded in bytes too, so no read returns more than a few MB."""
    tasks = _tasks("many", 20_000, tags=["arith"])
    listed = await put_task_list(store, tasks)
    assert listed.total == 20_000 and len(listed.chunks) == 20_000 // TASKS_PER_CHUNK
    assert len(listed.model_dump_json()) < 5 * KB
    cache = ChunkCache(store)
    for offset, limit, want in ((0, 10, 10), (495, 10, 5), (500, 500, 500), (19_999, 7, 1)):
        part = listed.slice_at(offset, limit)
        got = await cache.read(part)
        assert part.limit == want and got == tasks[offset:offset + want]
    with pytest.raises(IndexError):
        listed.slice_at(20_000, 1)
    # written twice (a batch submitted again): the same reference, nothing stored twice
    assert await put_task_list(store, tasks) == listed
    # bounded in bytes: 1 MB tasks go 3 to a chunk of at most 4 MiB, one huge task alone
    big = [Task(id=f"big-{i}", question=str(i) * KB * KB) for i in range(7)]
    huge = Task(id="huge", question="h" * (5 * KB * KB))
    listed = await put_task_list(store, [*big, huge])
    assert [c.count for c in listed.chunks] == [3, 3, 1, 1]
    assert await read_all(store, listed) == [*big, huge]


async def test_a_chunk_that_is_not_what_its_reference_says_fails_clearly(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    listed = await put_task_list(store, _tasks("c", 3))
    [chunk] = listed.chunks
    with pytest.raises(TaskListError, match="holds 3 tasks, not 4"):
        await read_chunk(store, chunk.model_copy(update={"count": 4}))
    not_tasks = await store.put(b'{"question": ""}\n')
    with pytest.raises(TaskListError, match="not a task"):
        await read_chunk(store, chunk.model_copy(update={"ref": not_tasks, "count": 1}))
    from conductor_engine.engine.storage.blobs import key_for

    store.path(key_for(chunk.ref)).write_bytes(b"tampered\n")
    with pytest.raises(BlobCorrupt):
        await read_chunk(store, chunk)
    with pytest.raises(ValidationError, match="hold 3 tasks, not 5"):
        TaskList(chunks=listed.chunks, total=5)


def test_the_training_pick_by_ranges_is_the_inline_pick() -> None:
    tasks = _tasks("p", 7)
    for total in (1, 2, 5, 7):
        for k in (1, 2, 3, 7, 9):
            for iteration in range(6):
                want = pick_tasks(tasks[:total], iteration, k)
                got = [tasks[o + i] for o, n in pick_ranges(total, iteration, k)
                       for i in range(n)]
                assert got == want, (total, k, iteration)
    assert pick_ranges(0, 3, 4) == []


async def test_a_5000_task_batch_starts_with_an_input_of_a_few_kb(
    conductor: ConductorClient, client: Client,
) -> None:
    """No worker polls this test's queue: the batch is only started, and its first event read.
    Inline, the same tasks would be a payload of megabytes, written again at every
    continue-as-new."""
    name = f"input-{uuid.uuid4().hex[:6]}"
    tasks = _tasks(name, 5000)
    await conductor.submit_batch(name, tasks, concurrency=100)
    handle = client.get_workflow_handle(batch_workflow_id(name))
    try:
        events = [e async for e in handle.fetch_history_events()]
    finally:
        await handle.terminate("only its input was wanted")
    inline = len(BatchInput(name=name, tasks=[t.model_copy(update={"batch": name})
                                              for t in tasks]).model_dump_json())
    print(f"input of a 5,000-task batch: {_input_bytes(events):,} bytes by reference, "
          f"{inline:,} inline")
    [payload] = events[0].workflow_execution_started_event_attributes.input.payloads
    assert not payload.external_payloads, "small enough to stay in history itself"
    assert _input_bytes(events) < 3 * KB < 1000 * KB < inline


async def test_a_batch_reads_its_tasks_a_chunk_at_a_time_across_continue_as_new(
    agent_server: AgentServer, client: Client, settings: Settings,
) -> None:
    """13 tasks in chunks of 4, 5 children a run, 3 at a time: every task runs once, in order,
    each run's input is the same small reference (and the index to go on from), and a run reads
    only the slices it starts, never past a chunk's end."""
    agent_server.set_responder("conductor", lambda p: plan_json(("gpt", "Answer it.", [])))
    agent_server.set_responder("gpt", lambda p: "an answer")
    name = f"chunks-{uuid.uuid4().hex[:6]}"
    tasks = [t.model_copy(update={"batch": name}) for t in _tasks(name, 13)]
    listed = await put_task_list(blob_store(settings), tasks, max_tasks=4)
    assert [c.count for c in listed.chunks] == [4, 4, 4, 1]
    inp = BatchInput(name=name, task_list=listed, concurrency=3, children_per_run=5,
                     report=False)
    pool = make_pool(agent_server)
    async with running_worker(client, settings, pool):
        handle = await client.start_workflow(BATCH_WORKFLOW, inp, id=batch_workflow_id(name),
                                             task_queue=task_queue_of(settings, pool),
                                             result_type=BatchProgress)
        progress = await asyncio.wait_for(handle.result(), timeout=120)
    assert progress.total == 13 and progress.completed == 13 and progress.continued == 2
    assert agent_server.calls("conductor") == 13
    runs = await _runs(client, batch_workflow_id(name))
    assert len(runs) == 3
    slices = []
    for events in runs:
        assert _input_bytes(events) < 2 * KB
        assert _max_pending_children(events) <= 3
        for e in events:
            if e.HasField("activity_task_scheduled_event_attributes"):
                [part] = await data_converter(settings).decode(
                    e.activity_task_scheduled_event_attributes.input.payloads, [dict])
                slices.append((part["chunk"]["ref"], part["start"], part["limit"]))
    refs = [c.ref for c in listed.chunks]
    assert slices == [(refs[0], 0, 4), (refs[1], 0, 1), (refs[1], 1, 3), (refs[2], 0, 2),
                      (refs[2], 2, 2), (refs[3], 0, 1)]
    started = [e.start_child_workflow_execution_initiated_event_attributes.workflow_id
               for events in runs for e in events
               if e.HasField("start_child_workflow_execution_initiated_event_attributes")]
    assert started == [batch_child_workflow_id(name, t.id) for t in tasks]


async def test_a_task_list_the_workers_cannot_find_fails_the_batch_saying_what_to_set(
    agent_server: AgentServer, client: Client, settings: Settings, tmp_path: Path,
) -> None:
    """The client wrote its tasks to a blob store the worker does not use (a directory of its
    own): after three attempts the batch fails, naming the missing chunk and the settings that
    must match, and no child was started."""
    name = f"elsewhere-{uuid.uuid4().hex[:6]}"
    listed = await put_task_list(LocalBlobStore(tmp_path / "clients-own"), _tasks(name, 3))
    inp = BatchInput(name=name, task_list=listed, report=False)
    pool = make_pool(agent_server)
    async with running_worker(client, settings, pool):
        handle = await client.start_workflow(BATCH_WORKFLOW, inp, id=batch_workflow_id(name),
                                             task_queue=task_queue_of(settings, pool))
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), timeout=60)
    message = str(failed.value.cause.cause)  # the activity error inside the activity failure
    assert listed.chunks[0].ref in message and "CONDUCTOR_S3_BUCKET" in message
    assert "CONDUCTOR_BLOB_DIR" in message
    [events] = await _runs(client, batch_workflow_id(name))
    assert not any(e.HasField("start_child_workflow_execution_initiated_event_attributes")
                   for e in events)
