"""A task list kept in the blob store, and the slice of it that one activity reads.

A batch or training run's tasks do not travel in its workflow input: a task file of 60 MB is over
the payload codec's 50 MiB cap, and the input is written into history again at every
continue-as-new. The client writes the list once to the blob store in chunks of JSON lines
(engine/storage/task_list_chunks.py); the workflow carries this small reference, and reads the tasks
it is about to start, a chunk at a time, through the `read_tasks` activity
(activities/batch.py). Chunks are content-addressed, so the same list written twice (a batch
submitted again) is stored once.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator


class TaskChunk(BaseModel):
    """One chunk: a blob of JSON lines, one Task each."""

    ref: str = Field(pattern=r"^sha256:[0-9a-f]{64}$", description="the blob's reference")
    count: int = Field(ge=1, description="tasks in the chunk")


class TaskList(BaseModel):
    """Where a task list lives: its chunks in order, and how many tasks they hold in all."""

    chunks: list[TaskChunk] = Field(default_factory=list)
    total: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _counts_add_up(self) -> TaskList:
        if sum(c.count for c in self.chunks) != self.total:
            raise ValueError(f"the chunks hold {sum(c.count for c in self.chunks)} tasks, "
                             f"not {self.total}")
        return self

    def slice_at(self, offset: int, limit: int) -> TaskSlice:
        """The tasks from `offset` on, at most `limit` of them and none past the end of the
        chunk that holds `offset`: what one `read_tasks` call returns."""
        if not 0 <= offset < self.total:
            raise IndexError(f"task {offset} is outside the list of {self.total}")
        start = offset
        for chunk in self.chunks:
            if start < chunk.count:
                return TaskSlice(chunk=chunk, start=start, limit=min(limit, chunk.count - start))
            start -= chunk.count
        raise AssertionError("unreachable: the counts add up to total")


class TaskSlice(BaseModel):
    """The `read_tasks` activity's input: `limit` tasks of one chunk from index `start`."""

    chunk: TaskChunk
    start: int = Field(ge=0)
    limit: int = Field(ge=1)
