"""Where tasks come from, in one call: a JSONL task file, `hf:NAME` (engine/tasks/files.py),
or a benchmark in its own row shape, `SHAPE:SOURCE` (engine/tasks/benchmark_shapes.py lists
them). The commands load through here; the two modules below it stay independent of each other."""

from __future__ import annotations

from typing import Any

from conductor_engine.engine.tasks import files
from conductor_engine.engine.tasks.benchmark_shapes import load_shaped, shape_of
from conductor_engine.engine.tasks.files import TaskFile


def load_tasks(source: str, **options: Any) -> TaskFile:
    """The tasks of `source`; keyword options go to its loader (`columns`, `seed` for a
    shape; `split`, `columns`, `limit`, ... for hf:). TaskFileError when it cannot be read."""
    if shape_of(source) is not None:
        return load_shaped(source, **options)
    return files.load_tasks(source, **options)
