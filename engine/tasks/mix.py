"""Training mixes: a task manifest (TOML) that draws a fixed number of problems from each of
several datasets, the way the Conductor paper trained on 960 problems of MATH, MMLU, RLPR and
LiveCodeBench. `conductor train start MIX.toml` reads one (examples/paper/train_mix.toml).

    name = "paper-mix"
    total = 960            # checked: the counts must add up to it
    seed = 0               # which rows are drawn
    heldout = ["paper"]    # suites (names or files) whose problems must stay out
    [[sources]]
    key = "math"           # the tasks' id prefix and their first tag
    name = "MATH"
    shape = "math"
    source = "DigitalLearningGmbH/MATH-lighteval"
    split = "train"
    count = 240

Each source is loaded as `SHAPE:SOURCE` (engine/tasks/benchmark_shapes.py); its valid tasks are
drawn by SHA-256 of (seed, id), so the same manifest gives the same 960 problems on every
machine and a row added to the dataset moves no other draw. A task becomes `KEY/ID` with KEY as
its first tag, so training's round-robin over tags (`interleave_tags`) deals the sources in
turn.

The held-out check: a mix task that is also a task of a held-out suite, by its row id (between
tasks with the same verifier) or by its question text (the same problem can carry another id in
another copy of a dataset, e.g. MATH500's problems are MATH's), is an overlap, and the mix is
refused with the first few named. Training on a benchmark's problems would inflate its score.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.tasks.suite import DataSource, SuiteError, read_toml

MAX_NAMED = 5
"""Overlapping problems an error names; it counts the rest."""


class MixSource(DataSource):
    """One dataset of a mix and how many problems to draw from it."""

    count: int = Field(ge=1, description="problems drawn from this source")
    split: str = "train"


class Mix(BaseModel):
    """A training mix: the sources, their counts, and the suites kept out of it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    total: int | None = Field(default=None, ge=1, description="the counts' sum, checked")
    seed: int = Field(default=0, ge=0)
    heldout: list[str] = Field(default_factory=list, description="suites (shipped names or "
                               "files) none of whose problems may be in the mix")
    sources: list[MixSource] = Field(min_length=1)
    path: Path | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _checked(self) -> Mix:
        keys = [s.key for s in self.sources]
        repeated = sorted({k for k in keys if keys.count(k) > 1})
        if repeated:
            raise ValueError(f"source keys must be unique; repeated: {', '.join(repeated)}")
        counted = sum(s.count for s in self.sources)
        if self.total is not None and counted != self.total:
            raise ValueError(f"the counts add up to {counted}, not total = {self.total}: "
                             "change a count or the total")
        return self

    def source_strings(self) -> list[tuple[MixSource, str]]:
        base = self.path.parent if self.path is not None else None
        return [(s, s.task_source(base)) for s in self.sources]

    def heldout_paths(self) -> list[str]:
        """The held-out suites, a relative file read from the manifest's directory."""
        base = self.path.parent if self.path is not None else Path()
        return [str(base / h) if (base / h).is_file() else h for h in self.heldout]


def is_mix(source: str) -> bool:
    """Whether a task source names a training mix (a .toml file) rather than tasks."""
    return source.lower().endswith(".toml")


def load_mix(path: str | Path) -> Mix:
    p = Path(path).expanduser()
    if not p.is_file():
        raise SuiteError(f"training mix {str(p)!r} not found: give a manifest (TOML), e.g. "
                         "examples/paper/train_mix.toml")
    return revised(read_toml(Mix, p.read_bytes(), str(p)), path=p)


def _rank(seed: int, task_id: str) -> bytes:
    return hashlib.sha256(f"mix\x1f{seed}\x1f{task_id}".encode()).digest()


def draw(source: MixSource, tasks: list[Task], seed: int) -> list[Task]:
    """`source.count` of `tasks`, the same ones for the same seed; the tasks renamed `KEY/ID`
    with KEY as their first tag. SuiteError when there are fewer valid tasks than that."""
    if len(tasks) < source.count:
        raise SuiteError(f"{source.name}: {len(tasks)} valid task(s), fewer than the count "
                         f"{source.count}: lower the count or choose a larger split")
    chosen = sorted(tasks, key=lambda t: _rank(seed, t.id))[:source.count]
    return [revised(source.task(t), tags=[source.key, *t.tags]) for t in chosen]


def _text(question: str) -> str:
    return re.sub(r"\s+", " ", question).strip().casefold()


def _row_id(task: Task) -> str:
    """The id the dataset gave the row: a suite's or mix's `KEY/` prefix removed."""
    return task.id.split("/", 1)[1] if task.dataset and task.id.startswith(
        f"{task.dataset}/") else task.id


def overlap(mix: Iterable[Task], heldout: Iterable[Task]) -> list[str]:
    """One line per mix task that is also a held-out task, by row id or question text. Ids
    are compared between tasks judged alike (the same verifier): LiveCodeBench's `3999` and an
    unrelated dataset's row 3999 are not the same problem."""
    by_id: dict[tuple[str | None, str], Task] = {}
    by_text: dict[str, Task] = {}
    for t in heldout:
        by_id.setdefault((t.verifier, _row_id(t)), t)
        by_text.setdefault(_text(t.question), t)
    found = []
    for t in mix:
        if (other := by_id.get((t.verifier, _row_id(t)))) is not None:
            found.append(f"{t.id} has the id of held-out {other.id}")
        elif (other := by_text.get(_text(t.question))) is not None:
            found.append(f"{t.id} has the question of held-out {other.id}")
    return found


def overlap_error(found: list[str], suites: list[str]) -> str:
    """The one-line refusal: how many, the first MAX_NAMED, what to do."""
    named = "; ".join(found[:MAX_NAMED])
    more = f"; and {len(found) - MAX_NAMED} more" if len(found) > MAX_NAMED else ""
    return (f"the training mix holds {len(found)} problem(s) of the held-out suite(s) "
            f"{', '.join(suites)}: {named}{more}. Training on them would inflate those "
            "benchmarks' scores: draw the mix from other splits or releases (or remove the "
            "suite from `heldout` if it is not evaluated)")
