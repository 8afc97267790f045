"""Task lists in the blob store: written once by the client, read a chunk at a time by workers.

A chunk is a blob of JSON lines, one Task each, at most TASKS_PER_CHUNK tasks and CHUNK_BYTES
bytes (a single larger task is a chunk of its own); the reference to the list is a TaskList
(engine/contracts/task_list_refs.py). Blobs are content-addressed and checked against their hash
on every read, so a chunk can be cached by its reference for as long as a process lives.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from conductor_engine.engine.contracts.limits import CHUNK_BYTES, TASKS_PER_CHUNK
from conductor_engine.engine.contracts.task_list_refs import TaskChunk, TaskList, TaskSlice
from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.storage.blobs import BlobStore


class TaskListError(RuntimeError):
    """A stored chunk does not hold what its reference says (count, or a line that is not a
    task); the message names the chunk."""


def chunk_lines(tasks: Iterable[Task], *, max_tasks: int = TASKS_PER_CHUNK,
                max_bytes: int = CHUNK_BYTES) -> Iterable[list[bytes]]:
    """The tasks as JSON lines, grouped into chunks of at most `max_tasks` tasks and
    `max_bytes` bytes (a task longer than `max_bytes` alone)."""
    lines: list[bytes] = []
    size = 0
    for task in tasks:
        line = task.model_dump_json().encode() + b"\n"
        if lines and (len(lines) >= max_tasks or size + len(line) > max_bytes):
            yield lines
            lines, size = [], 0
        lines.append(line)
        size += len(line)
    if lines:
        yield lines


async def put_task_list(store: BlobStore, tasks: Iterable[Task], *,
                        max_tasks: int = TASKS_PER_CHUNK,
                        max_bytes: int = CHUNK_BYTES) -> TaskList:
    """Write `tasks` to `store` in chunks and return the reference to the list."""
    chunks = [TaskChunk(ref=await store.put(b"".join(lines)), count=len(lines))
              for lines in chunk_lines(tasks, max_tasks=max_tasks, max_bytes=max_bytes)]
    return TaskList(chunks=chunks, total=sum(c.count for c in chunks))


async def read_chunk(store: BlobStore, chunk: TaskChunk) -> list[Task]:
    """Every task of `chunk` (its bytes checked against the reference by the store)."""
    data = await store.get(chunk.ref)
    lines = data.removesuffix(b"\n").split(b"\n")
    if len(lines) != chunk.count:
        raise TaskListError(f"task chunk {chunk.ref} holds {len(lines)} tasks, not {chunk.count}")
    try:
        return [Task.model_validate_json(line) for line in lines]
    except ValueError as e:
        raise TaskListError(f"task chunk {chunk.ref} holds a line that is not a task: {e}") from e


class ChunkCache:
    """The last few chunks read, by reference (a batch reads the same chunk for a few runs in
    a row; a training run reads a few tasks of its list each iteration)."""

    def __init__(self, store: BlobStore, size: int = 4) -> None:
        self.store, self.size = store, size
        self._chunks: OrderedDict[str, list[Task]] = OrderedDict()

    async def read(self, part: TaskSlice) -> list[Task]:
        """The tasks of one slice."""
        ref = part.chunk.ref
        tasks = self._chunks.get(ref)
        if tasks is None:
            tasks = await read_chunk(self.store, part.chunk)
            self._chunks[ref] = tasks
            while len(self._chunks) > self.size:
                self._chunks.popitem(last=False)
        else:
            self._chunks.move_to_end(ref)
        return tasks[part.start:part.start + part.limit]


async def read_all(store: BlobStore, task_list: TaskList) -> list[Task]:
    """Every task of the list, in order (for tools and tests; workflows read by slices)."""
    return [t for c in task_list.chunks for t in await read_chunk(store, c)]
