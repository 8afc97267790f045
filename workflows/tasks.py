"""Reading a batch's or training run's tasks from its task list, inside a workflow.

The list is in the blob store (engine/contracts/task_list_refs.py); the workflow reads the tasks it
is about to start through the `read_tasks` activity, one slice of one chunk per call, so each
result stays a chunk at most (a few MB, kept in the blob store by the payload codec).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from conductor_engine.engine.contracts.names import READ_TASKS_ACTIVITY
    from conductor_engine.engine.contracts.task_list_refs import TaskList
    from conductor_engine.engine.contracts.tasks import Task

READ_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=30))
"""A blob store that cannot be reached is waited for, as every activity waits for what it
needs; a chunk that is not there fails the run after a few attempts (activities/batch.py)."""


async def read_slice(tasks: TaskList, offset: int, limit: int) -> list[Task]:
    """Tasks from `offset`: at most `limit`, and none past the end of the chunk that holds
    `offset` (one activity)."""
    part = tasks.slice_at(offset, limit)
    return await workflow.execute_activity(
        READ_TASKS_ACTIVITY, part, result_type=list[Task],
        start_to_close_timeout=timedelta(minutes=2), retry_policy=READ_RETRY,
        summary=f"read tasks {offset + 1}–{offset + part.limit} of {tasks.total}",
    )


async def read_tasks(tasks: TaskList, offset: int, count: int) -> list[Task]:
    """Tasks `offset` to `offset + count - 1` of the list, a slice at a time."""
    out: list[Task] = []
    while len(out) < count:
        out.extend(await read_slice(tasks, offset + len(out), count - len(out)))
    return out
