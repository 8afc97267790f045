"""Tasks from files: JSONL task files and Hugging Face datasets (hub or local).

A JSONL task file holds one JSON object per line:

    {"id": "gsm-1", "question": "What is 6 x 7?", "answer": "42", "verifier": "math",
     "tags": ["arithmetic"], "dataset": "demo", "options": {"max_steps": 3}}

Only `question` is required. `answer` (or its alias `reference`) becomes `Task.reference` and may
be a number; `id` may be a number; `dataset` defaults to the file's stem; `options` overrides
RunOptions fields; `agents` (a list of pool ids) limits the run to those agents, shown to the
conductor in that order (an id the worker's pool lacks fails the run at its first plan); other
keys are ignored (datasets carry metadata). Blank lines are skipped.

A bad line never stops the load: it is reported as a TaskLineError with its line number (1-based;
for a Hugging Face dataset, the 0-based row index) and, where one field is at fault, the field
(`FILE:LINE: field tags.1: ...`), and the loader reads on, so every bad line of a file is found
in one pass. What to do with a file that has bad lines is the caller's decision: the commands
that submit tasks (`conductor batch`, `conductor train start`) list the bad lines (the first
MAX_LISTED and a count of the rest) and submit nothing, so a batch is never a silently smaller
set of tasks than its file; `conductor tasks check FILE --json` writes out the valid tasks.
Every string of a task, nested ones included, must be storable in PostgreSQL text: a NUL or a
lone surrogate (a JSON `\\ud800` escape) is a bad line, not a failed trace insert later. So is a
task over MAX_TASK_BYTES as JSON, and a line over MAX_JSON_REQUEST_BYTES is one without being
parsed (engine/contracts/limits.py).
A UTF-8 byte order mark at the start of the file is skipped.

A line without an id gets a stable one, `<dataset>-<first 10 hex digits of the SHA-256 of the
question>`: it does not change when lines are added, removed or reordered, so resumed batches
and GRPO groups keep referring to the same task.
"""

from __future__ import annotations

import codecs
import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr
from pydantic import ValidationError as PydanticValidationError

from conductor_engine.engine.contracts.limits import MAX_JSON_REQUEST_BYTES, size_label
from conductor_engine.engine.contracts.tasks import RunOptions, Task
from conductor_engine.engine.rewards import VERIFIERS
from conductor_engine.engine.tasks.checks import check_storable, oversize_error, unstorable_text
from conductor_engine.engine.text import shorten

HF_PREFIX = "hf:"
TASK_FIELDS = ("question", "answer", "id", "tags", "verifier", "dataset")
MAX_LISTED = 50
"""How many bad lines a command lists before it sums up the rest."""
_LOCAL_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


class TaskFileError(ValueError):
    """A task source that cannot be read at all (missing file, unknown dataset)."""


class TaskLineError(BaseModel):
    line: int = Field(description="1-based line of a JSONL file; 0-based row of a dataset")
    message: str = Field(description="`field X: why` where one field is at fault")


class TaskFile(BaseModel):
    """What a task source held: the tasks that loaded and the lines that did not."""

    path: str
    tasks: list[Task] = Field(default_factory=list)
    errors: list[TaskLineError] = Field(default_factory=list)

    def error_lines(self, limit: int | None = MAX_LISTED) -> list[str]:
        """One `FILE:LINE: why` line per bad line, the first `limit` of them, then a line
        saying how many more there are: a file of 10,000 bad lines is summed up, not
        scrolled past, and no bad line goes unmentioned."""
        shown = self.errors if limit is None else self.errors[:limit]
        lines = [f"{self.path}:{e.line}: {e.message}" for e in shown]
        if len(shown) < len(self.errors):
            lines.append(f"{self.path}: … and {len(self.errors) - len(shown)} more bad "
                         f"line(s) ({len(self.errors)} in all): `conductor tasks check "
                         f"{self.path} --all` lists them")
        return lines


class _Record(BaseModel):
    """One line or row as written, before it becomes a Task: strict, so a wrong type is
    reported instead of silently converted (numbers are accepted for id and answer)."""

    model_config = ConfigDict(extra="ignore")

    id: StrictStr | StrictInt | None = None
    question: StrictStr
    answer: StrictStr | StrictInt | StrictFloat | None = None
    reference: StrictStr | StrictInt | StrictFloat | None = None
    verifier: StrictStr | None = None
    tags: list[StrictStr] = Field(default_factory=list)
    parts: list[StrictStr] = Field(default_factory=list)
    dataset: StrictStr | None = None
    options: RunOptions | None = None
    agents: list[StrictStr] | None = None


class _Problem(Exception):
    """One record's problem, worded for the person who wrote the file."""


def _describe(error: PydanticValidationError) -> str:
    parts = []
    for e in error.errors():
        where = ".".join(str(p) for p in e["loc"])
        message = "missing" if e["type"] == "missing" else e["msg"]
        parts.append(f"field {where}: {message}" if where else message)
    return "; ".join(parts)


def derived_id(dataset: str, question: str) -> str:
    digest = hashlib.sha256(question.encode("utf-8")).hexdigest()[:10]
    return f"{dataset}-{digest}"


def _to_task(raw: dict[str, Any], dataset: str, verifier: str | None) -> Task:
    try:
        rec = _Record.model_validate(raw)
    except PydanticValidationError as exc:
        raise _Problem(_describe(exc)) from exc
    try:  # before anything hashes or stores the text
        check_storable(rec)
    except ValueError as exc:
        raise _Problem(str(exc)) from exc
    if rec.dataset is None and (found := unstorable_text(dataset)) is not None:
        raise _Problem(f"field dataset: not given, and the default, the file's name, "
                       f"{found[1]}: give \"dataset\" or rename the file")
    if not rec.question.strip():
        raise _Problem("field question: empty")
    if rec.answer is not None and rec.reference is not None:
        raise _Problem('field answer: give "answer" or "reference", not both')
    name = rec.verifier if rec.verifier is not None else verifier
    if name is not None and name.strip().lower() not in VERIFIERS:
        raise _Problem(f"field verifier: unknown {name!r}; valid: {', '.join(VERIFIERS)}")
    answer = rec.answer if rec.answer is not None else rec.reference
    ds = rec.dataset or dataset
    try:  # the Task's own rules (distinct, non-empty `agents`), as a line error
        task = Task(
            id=str(rec.id) if rec.id is not None else derived_id(ds, rec.question),
            question=rec.question, reference=None if answer is None else str(answer),
            verifier=name, dataset=ds, tags=rec.tags, parts=rec.parts,
            options=rec.options or RunOptions(),
            agents=rec.agents,
        )
    except PydanticValidationError as exc:
        raise _Problem(_describe(exc)) from exc
    if (too_large := oversize_error(task)) is not None:
        raise _Problem(too_large)
    return task


def _collect(rows: Iterable[tuple[int, Any]], path: str, dataset: str,
             verifier: str | None = None) -> TaskFile:
    """Turn (line, parsed object or _Problem) pairs into tasks and line errors, refusing
    duplicate ids."""
    out = TaskFile(path=path)
    first_line: dict[str, int] = {}
    for line, raw in rows:
        try:
            if isinstance(raw, _Problem):
                raise raw
            if not isinstance(raw, dict):
                raise _Problem(f"expected a JSON object, got {type(raw).__name__}")
            task = _to_task(raw, dataset, verifier)
            if task.id in first_line:
                what = ("field id: duplicate" if raw.get("id") is not None
                        else "field question: duplicate (same derived id)")
                raise _Problem(f"{what} {task.id!r}, first on line {first_line[task.id]}")
        except _Problem as problem:
            out.errors.append(TaskLineError(line=line, message=str(problem)))
            continue
        first_line[task.id] = line
        out.tasks.append(task)
    return out


# --- JSONL --------------------------------------------------------------------------------


def _jsonl_rows(data: bytes) -> Iterator[tuple[int, Any]]:
    data = data.removeprefix(codecs.BOM_UTF8)  # editors on Windows write one
    for number, raw in enumerate(data.splitlines(), start=1):
        if len(raw) > MAX_JSON_REQUEST_BYTES:  # refused unparsed: no task fits in it
            yield number, _Problem(f"the line is {size_label(len(raw))}, over the "
                                   f"{size_label(MAX_JSON_REQUEST_BYTES)} a task's line may be; "
                                   "shorten its question, context or reference")
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield number, _Problem(f"not UTF-8: {exc.reason} at byte {exc.start} of the line; "
                                   "save the file as UTF-8")
            continue
        if not text.strip():
            continue
        try:
            yield number, json.loads(text)
        except json.JSONDecodeError as exc:
            yield number, _Problem(f"invalid JSON: {exc.msg} (column {exc.colno})")
        except (RecursionError, ValueError) as exc:  # nested too deep, an integer too long
            yield number, _Problem(f"cannot be read as JSON: {shorten(str(exc), 120)}")


def load_jsonl(path: str | Path, *, dataset: str | None = None) -> TaskFile:
    """Load a JSONL task file (format in the module docstring). `dataset` names the tasks'
    dataset where a line does not; the default is the file's stem. Raises TaskFileError only
    when the file cannot be read at all."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise TaskFileError(
            f"task file {str(p)!r} not found: give the path of a JSONL file (one JSON object "
            'per line, with at least "question"), or hf:NAME[:CONFIG][@SPLIT] for a Hugging '
            "Face dataset"
        ) from None
    except IsADirectoryError:
        raise TaskFileError(f"{str(p)!r} is a directory: give a JSONL file inside it, or "
                            f"hf:{p} if it is a saved Hugging Face dataset") from None
    except OSError as exc:
        raise TaskFileError(f"cannot read task file {str(p)!r}: {exc.strerror}") from None
    return _collect(_jsonl_rows(data), str(p), dataset or p.stem)


# --- Hugging Face -------------------------------------------------------------------------


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise TaskFileError(
            "loading Hugging Face datasets needs the `datasets` package: "
            "pip install 'conductor-engine[hf]'"
        ) from None
    return datasets


def _pick_split(loaded: Any, split: str, name: str) -> Any:
    """A saved DatasetDict holds several splits; a saved Dataset is one."""
    if not hasattr(loaded, "keys"):
        return loaded
    if split not in loaded:
        raise TaskFileError(f"dataset {name!r} has no split {split!r}; "
                            f"it has {', '.join(loaded.keys())}")
    return loaded[split]


def _open_dataset(name: str, config: str | None, split: str) -> Any:
    """NAME is a hub id, a directory saved with `save_to_disk`, a directory of data files, or
    one .json/.jsonl/.csv/.parquet file (whose rows become the requested split)."""
    ds = _datasets()
    local = Path(name).expanduser()
    try:
        if local.is_dir() and any((local / f).exists()
                                  for f in ("dataset_dict.json", "state.json")):
            return _pick_split(ds.load_from_disk(str(local)), split, name)
        if local.is_file():
            builder = _LOCAL_BUILDERS.get(local.suffix.lower())
            if builder is None:
                raise TaskFileError(f"cannot tell the format of {name!r}: use one of "
                                    f"{', '.join(_LOCAL_BUILDERS)}")
            return ds.load_dataset(builder, data_files={split: str(local)}, split=split)
        return ds.load_dataset(str(local) if local.is_dir() else name, config, split=split)
    except TaskFileError:
        raise
    except Exception as exc:  # datasets raises many kinds: not found, offline, bad config
        raise TaskFileError(f"cannot load dataset {name!r} (config {config!r}, split "
                            f"{split!r}): {type(exc).__name__}: {exc}") from None


def _mapping(columns: dict[str, str] | None, available: list[str]) -> dict[str, str]:
    """{dataset column: task field}; columns already named like task fields map themselves."""
    mapping = {c: c for c in available if c in TASK_FIELDS}
    for column, field in (columns or {}).items():
        if field not in TASK_FIELDS:
            raise TaskFileError(f"column mapping {column!r} → {field!r}: {field!r} is not a "
                                f"task field ({', '.join(TASK_FIELDS)}); the mapping goes "
                                "from dataset column to task field")
        if column not in available:
            raise TaskFileError(f"column {column!r} is not in the dataset; it has "
                                f"{', '.join(available)}")
        mapping = {c: f for c, f in mapping.items() if f != field}
        mapping[column] = field
    return mapping


def _hf_rows(table: Any, mapping: dict[str, str], limit: int | None
             ) -> Iterator[tuple[int, Any]]:
    for index, row in enumerate(table):
        if limit is not None and index >= limit:
            return
        yield index, {field: row[column] for column, field in mapping.items()
                      if row[column] is not None}


def load_hf(name: str, *, split: str = "test", config: str | None = None,
            columns: dict[str, str] | None = None, limit: int | None = None,
            verifier: str | None = None) -> TaskFile:
    """Load tasks from a Hugging Face dataset: a hub id (needs the network, or the local
    cache), or a local path (see `_open_dataset`). `columns` maps dataset columns to task fields
    (question, answer, id, tags, verifier, dataset), e.g. {"problem": "question",
    "solution": "answer"}; `verifier` applies to rows that do not name one. Rows are checked
    like JSONL lines; errors carry the row index."""
    table = _open_dataset(name, config, split)
    mapping = _mapping(columns, list(table.column_names))
    if "question" not in mapping.values():
        raise TaskFileError(f"no question column in {name!r}: map one with "
                            f"columns={{'<column>': 'question'}}; it has "
                            f"{', '.join(table.column_names)}")
    source = f"{HF_PREFIX}{name}{':' + config if config else ''}@{split}"
    dataset = Path(name).stem if Path(name).exists() else name
    return _collect(_hf_rows(table, mapping, limit), source, dataset, verifier)


def parse_hf_source(source: str) -> tuple[str, str | None, str | None]:
    """`hf:NAME[:CONFIG][@SPLIT]` → (name, config, split)."""
    rest = source.removeprefix(HF_PREFIX)
    split = None
    if "@" in rest:
        rest, split = rest.rsplit("@", 1)
    name, _, config = rest.partition(":")
    return name, config or None, split or None


def load_tasks(source: str, **kw: Any) -> TaskFile:
    """`hf:NAME[:CONFIG][@SPLIT]` → `load_hf`; anything else is a JSONL path → `load_jsonl`.
    Keyword arguments go to the loader. (engine/tasks/sources.py adds the benchmark shapes.)"""
    if source.startswith(HF_PREFIX):
        name, config, split = parse_hf_source(source)
        if config is not None:
            kw["config"] = config
        if split is not None:
            kw["split"] = split
        return load_hf(name, **kw)
    return load_jsonl(source, **kw)
