"""Benchmark suites: several benchmarks, each a dataset read in its own row shape, run as one
eval (`conductor eval --suite NAME|FILE`) and reported as one table, a column per benchmark.

A suite file is TOML:

    name = "paper"
    title = "..."          # what the published figures are from
    citation = "..."
    [options]              # RunOptions for every task (e.g. step_deadline_s)
    [[benchmarks]]
    key = "gpqa-diamond"   # the task ids' prefix and the report's column key
    name = "GPQA-Diamond"  # the column's title
    shape = "gpqa"         # engine/tasks/benchmark_shapes.py
    source = "Idavidrein/gpqa"   # a hub id, or a local .jsonl/.parquet/... file or directory
    config = "gpqa_diamond"
    split = "train"
    paper = 87.5           # the published accuracy in %, left out where the paper's is unknown

A relative local `source` is read from the suite file's directory (or, failing that, the
working directory), so a suite can travel with its data. Each task's id becomes `KEY/ID` and its
dataset `KEY`: two benchmarks may number their rows alike, and the report groups runs by
dataset. Shipped suites live beside this module in `suites/` (`paper`: the Conductor paper's
evaluation set).
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.contracts.tasks import RunOptions, Task
from conductor_engine.engine.tasks.benchmark_shapes import SHAPES
from conductor_engine.engine.toml_errors import not_utf8, toml_error, utf8_text

SUITES_PACKAGE = "conductor_engine.engine.tasks.suites"
M = TypeVar("M", bound=BaseModel)


class SuiteError(ValueError):
    """A suite file that cannot be used; the message names the file and what to fix."""


class DataSource(BaseModel):
    """A dataset read in one row shape: a suite's benchmark or a training mix's source."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$",
                     description="lower-case id: the tasks' id prefix and the column's key")
    name: str = Field(min_length=1, description="the report column's title")
    shape: str = Field(description="the row shape (engine/tasks/benchmark_shapes.py)")
    source: str = Field(min_length=1, description="a Hugging Face hub id, or a local file "
                        "(.jsonl read directly; .parquet/.csv/.json through datasets) or a "
                        "saved dataset directory")
    config: str | None = None
    split: str = "test"
    columns: dict[str, str] = Field(default_factory=dict,
                                    description="shape field -> the source's column")

    @field_validator("shape")
    @classmethod
    def _known_shape(cls, shape: str) -> str:
        if shape not in SHAPES:
            raise ValueError(f"unknown shape {shape!r}; use one of {', '.join(SHAPES)}")
        return shape

    def task_source(self, base: Path | None = None) -> str:
        """The `SHAPE:SOURCE` string the task loaders read (engine/tasks/sources.py)."""
        local = Path(self.source).expanduser()
        if not local.is_absolute() and base is not None and (base / local).exists():
            local = base / local
        if local.suffix.lower() == ".jsonl":
            return f"{self.shape}:{local}"
        name = str(local) if local.exists() else self.source
        return f"{self.shape}:hf:{name}{':' + self.config if self.config else ''}@{self.split}"

    def task(self, task: Task, options: dict[str, Any] | None = None) -> Task:
        """A loaded task renamed `KEY/ID` with dataset KEY, and `options` (RunOptions fields)
        set on it."""
        merged = task.options
        if options:
            merged = RunOptions.model_validate({**task.options.model_dump(), **options})
        return revised(task, id=f"{self.key}/{task.id}", dataset=self.key, options=merged)


class Benchmark(DataSource):
    """One benchmark of a suite, with the paper's figure for it."""

    paper: float | None = Field(default=None, ge=0, le=100, description="the published "
                                "accuracy (%) for reference; None where it is not known")


class Suite(BaseModel):
    """A list of benchmarks run as one eval, with the figures they are compared with."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                      description="the eval's default name")
    title: str = Field(default="", description="where the published figures come from")
    citation: str = ""
    reference: str = Field(default="published", description="the published row's label")
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="RunOptions fields set on every task")
    benchmarks: list[Benchmark] = Field(min_length=1)
    path: Path | None = Field(default=None, exclude=True, description="the file read")

    @model_validator(mode="after")
    def _checked(self) -> Suite:
        keys = [b.key for b in self.benchmarks]
        repeated = sorted({k for k in keys if keys.count(k) > 1})
        if repeated:
            raise ValueError(f"benchmark keys must be unique; repeated: {', '.join(repeated)}")
        RunOptions.model_validate(self.options)  # a wrong option fails here, not per task
        return self

    def sources(self) -> list[tuple[Benchmark, str]]:
        """Each benchmark with its loader source string."""
        base = self.path.parent if self.path is not None else None
        return [(b, b.task_source(base)) for b in self.benchmarks]

    def task(self, benchmark: Benchmark, task: Task) -> Task:
        """A loaded task as this suite runs it: `KEY/ID`, dataset KEY, the suite's options."""
        return benchmark.task(task, self.options)

    def published(self) -> dict[str, float]:
        """{benchmark key: published accuracy as a fraction} where the suite gives one."""
        return {b.key: round(b.paper / 100, 6) for b in self.benchmarks if b.paper is not None}


def shipped() -> list[str]:
    """The names of the suites that ship with the engine."""
    return sorted(f.name.removesuffix(".toml") for f in resources.files(SUITES_PACKAGE).iterdir()
                  if f.name.endswith(".toml"))


def load_suite(name_or_path: str) -> Suite:
    """A suite file by path, or a shipped suite by name; SuiteError says what is wrong."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        where, raw = str(path), path.read_bytes()
    elif name_or_path in shipped():
        where = f"the shipped suite {name_or_path!r}"
        raw = (resources.files(SUITES_PACKAGE) / f"{name_or_path}.toml").read_bytes()
        path = Path(str(resources.files(SUITES_PACKAGE) / f"{name_or_path}.toml"))
    else:
        raise SuiteError(f"no suite {name_or_path!r}: give a suite file (TOML) or one of the "
                         f"shipped suites: {', '.join(shipped())}")
    return revised(read_toml(Suite, raw, where), path=path)


def read_toml(model: type[M], raw: bytes, where: str) -> M:
    """A hand-written TOML file as `model`, every failure one line naming the file."""
    try:
        data = tomllib.loads(utf8_text(raw))
    except UnicodeDecodeError as e:
        raise SuiteError(not_utf8(where, e)) from None
    except tomllib.TOMLDecodeError as e:
        raise SuiteError(toml_error(where, e)) from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "top level"
        more = f" ({len(e.errors())} problems in all)" if len(e.errors()) > 1 else ""
        raise SuiteError(f"{where}: invalid at {field}: {first['msg']}{more}") from None
