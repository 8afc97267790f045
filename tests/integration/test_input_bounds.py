"""A task over MAX_TASK_BYTES (engine/contracts/limits.py) is refused in one line by every way
in (the Python API, task files, the CLI) before anything starts, and a ConductWorkflow started
with one anyway fails at once with the reason, on the real Temporal dev server: no workflow is
left running because of its input.

Before the bound, a 30 MB question started a run whose record step could never be scheduled
(the payload passed the storage driver's 50 MiB cap), so its workflow task failed and was
retried forever: the run stayed Running and could not even be cancelled.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError

from conductor_engine.engine.contracts.limits import MAX_JSON_REQUEST_BYTES, MAX_TASK_BYTES
from conductor_engine.engine.contracts.names import CONDUCT_WORKFLOW, conduct_workflow_id
from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.tasks.checks import task_bytes
from conductor_engine.runtime.client import ConductorClient, TaskTooLarge, task_queue_of
from tests.agent_server import AgentServer
from tests.cli import run_conductor
from tests.conftest import make_pool, running_worker

MB = 1024 * 1024


async def _open_runs(client: Client, queue: str) -> list[str]:
    """Every workflow of this test's task queue that is still running."""
    return [wf.id async for wf in client.list_workflows(
        f'TaskQueue = "{queue}" AND ExecutionStatus = "Running"')]


def test_a_task_at_the_bound_passes_and_one_byte_over_does_not() -> None:
    from conductor_engine.engine.tasks.checks import check_size

    task = Task(id="edge", question="x")
    task = task.model_copy(update={"question": "x" * (MAX_TASK_BYTES - task_bytes(task) + 1)})
    assert task_bytes(task) == MAX_TASK_BYTES
    check_size(task)
    over = task.model_copy(update={"question": task.question + "x"})
    with pytest.raises(TaskTooLarge, match=r"^the task is 1,048,577 bytes \(1\.0 MiB\) as JSON, "
                       r"over the 1,048,576 bytes \(1\.0 MiB\) a task may be"):
        check_size(over)


async def test_the_client_refuses_an_oversized_task_before_anything_starts(
    conductor: ConductorClient, client: Client, settings: Settings,
) -> None:
    task = Task(id=f"big-{uuid.uuid4().hex[:8]}", question="x" * (2 * MB))
    with pytest.raises(TaskTooLarge) as refused:
        await conductor.submit(task)
    message = str(refused.value)
    assert "\n" not in message
    assert "(2.0 MiB) as JSON, over the 1,048,576 bytes (1.0 MiB)" in message
    assert "shorten its question" in message
    with pytest.raises(TaskTooLarge, match=r"tasks\.1 \('b-1'\) is 2,097,\d+ bytes"):
        await conductor.submit_batch(f"big-{uuid.uuid4().hex[:8]}", [
            Task(id="b-0", question="fine"), Task(id="b-1", question="y" * (2 * MB))])
    with pytest.raises(Exception, match="not found"):
        await client.get_workflow_handle(conduct_workflow_id(task.id)).describe()
    assert await _open_runs(client, conductor.task_queue) == []


async def test_a_run_started_with_an_oversized_task_fails_at_once_with_the_reason(
    agent_server: AgentServer, client: Client, settings: Settings,
) -> None:
    """Started around the client (the `temporal` CLI, an older client): the workflow fails
    non-retryably on its first workflow task, having scheduled nothing."""
    task = Task(id=f"huge-{uuid.uuid4().hex[:8]}", question="x" * (30 * MB))
    pool = make_pool(agent_server)
    async with running_worker(client, settings, pool):
        handle = await client.start_workflow(
            CONDUCT_WORKFLOW, task, id=conduct_workflow_id(task.id),
            task_queue=task_queue_of(settings, pool))
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    cause = failed.value.cause
    assert "(30.0 MiB) as JSON, over the 1,048,576 bytes" in str(cause)
    assert getattr(cause, "type", None) == "TaskTooLarge"
    assert (await handle.describe()).status == WorkflowExecutionStatus.FAILED
    events = [e async for e in handle.fetch_history_events()]
    assert not any(e.HasField("activity_task_scheduled_event_attributes") for e in events)
    assert not any(e.HasField("workflow_task_failed_event_attributes") for e in events)
    assert await _open_runs(client, task_queue_of(settings, pool)) == []


def test_batch_lists_an_oversized_line_and_submits_nothing(tmp_path: Path) -> None:
    """Refused while the file loads, before the command connects to anything."""
    tasks = tmp_path / "big.jsonl"
    lines = [{"id": "ok", "question": "What is 6 x 7?"},
             {"id": "big", "question": "x" * (MAX_TASK_BYTES + 10)},
             {"id": "huge", "question": "y" * (MAX_JSON_REQUEST_BYTES + 10)}]
    tasks.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    proc = run_conductor("batch", str(tasks), env={
        "CONDUCTOR_TEMPORAL_ADDRESS": "127.0.0.1:1", "CONDUCTOR_DATA_DIR": str(tmp_path)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    err = proc.stderr
    assert re.search(rf"{re.escape(str(tasks))}:2: the task is 1,04\d,\d{{3}} bytes \(1\.0 MiB\) "
                     r"as JSON, over the 1,048,576 bytes \(1\.0 MiB\) a task may be", err)
    assert re.search(rf"{re.escape(str(tasks))}:3: the line is 8,388,\d{{3}} bytes \(8\.0 MiB\), "
                     r"over the 8,388,608 bytes \(8\.0 MiB\) a task's line may be", err)
    assert "2 bad line(s)" in err and "nothing was submitted" in err
