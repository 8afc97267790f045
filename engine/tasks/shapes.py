"""Benchmarks in their own row shapes, read as tasks: `SHAPE:SOURCE`, where SOURCE is a JSONL
file or `hf:NAME[:CONFIG][@SPLIT]`, and SHAPE one of:

- `gpqa`: GPQA-style multiple choice. Columns `Question`, `Correct Answer`, `Incorrect Answer
  1..3` (and `Record ID`). The choices are shuffled per task with a seed derived from the eval
  seed and the row, recorded as the task's tag `choice-seed:N`, so a rerun asks the same
  question in the same order; the reference is the right letter, verifier `choice`.
- `math`: MATH-style answers. Columns `problem` and `answer`, or `solution` whose last
  `\\boxed{}` is the answer; verifier `math` (math-verify).
- `code`: LiveCodeBench-style stdin/stdout tasks. Columns `question_content`, `starter_code`
  (optional), `public_test_cases` and `private_test_cases` (JSON lists of {input, output,
  testtype}); the reference is the list of cases, verifier `code` (compared by trusted code
  outside the sandbox: engine/rewards/code_tests.py).

`columns` renames: {shape field: the source's column}, for a source that names them otherwise
(e.g. {"question": "Problem"}). Rows go through the same checks as a task file's lines.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from conductor_engine.engine.rewards.extract import last_boxed
from conductor_engine.engine.tasks import livecodebench as lcb
from conductor_engine.engine.tasks.files import (
    HF_PREFIX,
    TaskFile,
    TaskFileError,
    _collect,
    _jsonl_rows,
    _open_dataset,
    _Problem,
    parse_hf_source,
)

LETTERS = "ABCDEFGHIJ"

GPQA_COLUMNS = {"id": "Record ID", "question": "Question", "correct": "Correct Answer",
                "incorrect_1": "Incorrect Answer 1", "incorrect_2": "Incorrect Answer 2",
                "incorrect_3": "Incorrect Answer 3"}
MATH_COLUMNS = {"id": "unique_id", "question": "problem", "answer": "answer",
                "solution": "solution", "level": "level", "subject": "subject"}
CODE_COLUMNS = {"id": "question_id", "question": "question_content",
                "starter_code": "starter_code", "public": "public_test_cases",
                "private": "private_test_cases", "metadata": "metadata",
                "difficulty": "difficulty"}


def _get(row: dict[str, Any], columns: dict[str, str], field: str) -> Any:
    value = row.get(columns[field]) if field in columns else None
    return None if value is None or value == "" else value


def _need(row: dict[str, Any], columns: dict[str, str], field: str) -> Any:
    value = _get(row, columns, field)
    if value is None:
        raise _Problem(f"column {columns[field]!r} (the {field}) is missing or empty; map "
                       f"another column to it with --column {field}=NAME")
    return value


def choice_seed(seed: int, key: str) -> int:
    digest = hashlib.sha256(f"{seed}\x1f{key}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def gpqa_row(row: dict[str, Any], columns: dict[str, str], seed: int) -> dict[str, Any]:
    question = str(_need(row, columns, "question")).strip()
    correct = str(_need(row, columns, "correct")).strip()
    wrong = [str(v).strip() for k in sorted(columns) if k.startswith("incorrect")
             if (v := _get(row, columns, k)) is not None]
    if not wrong:
        raise _Problem("no incorrect answers: a multiple-choice row needs at least one")
    key = str(_get(row, columns, "id") or question)
    task_seed = choice_seed(seed, key)
    choices = [correct, *wrong]
    random.Random(task_seed).shuffle(choices)
    lines = [f"({LETTERS[i]}) {c}" for i, c in enumerate(choices)]
    text = (f"{question}\n\n" + "\n".join(lines)
            + "\n\nAnswer with the letter of the correct choice, as 'Answer: X'.")
    out: dict[str, Any] = {"question": text, "answer": LETTERS[choices.index(correct)],
                           "verifier": "choice", "tags": [f"choice-seed:{task_seed}"]}
    if (rid := _get(row, columns, "id")) is not None:
        out["id"] = str(rid)
    return out


def math_row(row: dict[str, Any], columns: dict[str, str], seed: int) -> dict[str, Any]:
    answer = _get(row, columns, "answer")
    if answer is None and (solution := _get(row, columns, "solution")) is not None:
        answer = last_boxed(str(solution))
    if answer is None:
        raise _Problem(f"no answer: neither column {columns['answer']!r} nor a \\boxed{{}} in "
                       f"column {columns['solution']!r}")
    out: dict[str, Any] = {"question": str(_need(row, columns, "question")),
                           "answer": str(answer), "verifier": "math",
                           "tags": [str(v) for f in ("subject", "level")
                                    if (v := _get(row, columns, f)) is not None]}
    if (rid := _get(row, columns, "id")) is not None:
        out["id"] = str(rid)
    return out


def _lcb_cases(row: dict[str, Any], columns: dict[str, str], field: str) -> list[dict[str, str]]:
    try:
        return lcb.read_cases(_get(row, columns, field))
    except lcb.CaseError as exc:
        raise _Problem(f"column {columns[field]!r}: {exc}") from None


def code_row(row: dict[str, Any], columns: dict[str, str], seed: int) -> dict[str, Any]:
    cases = _lcb_cases(row, columns, "public") + _lcb_cases(row, columns, "private")
    starter = str(_get(row, columns, "starter_code") or "")
    kinds = {c["testtype"] for c in cases}
    if not cases:
        raise _Problem("no test cases: both test-case columns are empty")
    if kinds - {"stdin", "functional"}:
        raise _Problem(f"unknown testtype {sorted(kinds - {'stdin', 'functional'})[0]!r}: "
                       "expected stdin or functional")
    if kinds == {"stdin"}:
        reference = json.dumps([{"input": c["input"], "output": c["output"]} for c in cases])
    elif kinds == {"functional"}:
        try:
            name = lcb.func_name(_get(row, columns, "metadata"))
            if name is None:
                raise lcb.CaseError(f"functional cases but no func_name in column "
                                    f"{columns['metadata']!r}")
            reference = lcb.call_reference(cases, name, starter)
        except lcb.CaseError as exc:
            raise _Problem(str(exc)) from None
    else:
        raise _Problem("the row mixes stdin and functional test cases")
    out: dict[str, Any] = {"question": lcb.prompt(str(_need(row, columns, "question")), starter),
                           "answer": reference, "verifier": "code"}
    if (rid := _get(row, columns, "id")) is not None:
        out["id"] = str(rid)
    if (difficulty := _get(row, columns, "difficulty")) is not None:
        out["tags"] = [str(difficulty)]
    return out


Shape = tuple[dict[str, str], Callable[[dict[str, Any], dict[str, str], int], dict[str, Any]]]
SHAPES: dict[str, Shape] = {"gpqa": (GPQA_COLUMNS, gpqa_row), "math": (MATH_COLUMNS, math_row),
                            "code": (CODE_COLUMNS, code_row)}


def shape_of(source: str) -> str | None:
    """The shape a `SHAPE:SOURCE` names, or None for a plain task file or hf: source."""
    head, sep, _ = source.partition(":")
    return head if sep and head in SHAPES else None


def _rows(source: str) -> tuple[Iterator[tuple[int, Any]], str]:
    if source.startswith(HF_PREFIX):
        name, config, split = parse_hf_source(source)
        table = _open_dataset(name, config, split or "test")
        return ((i, dict(r)) for i, r in enumerate(table)), Path(name).stem
    path = Path(source)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TaskFileError(f"cannot read {source!r}: {exc.strerror}") from None
    return _jsonl_rows(data), path.stem


def load_shaped(source: str, *, columns: dict[str, str] | None = None,
                seed: int = 0) -> TaskFile:
    """Tasks from `SHAPE:SOURCE` (module docstring); TaskFileError for an unknown shape or
    column name, or a source that cannot be read."""
    shape, _, inner = source.partition(":")
    if shape not in SHAPES:
        raise TaskFileError(f"unknown task shape {shape!r}: use one of {', '.join(SHAPES)}")
    defaults, convert = SHAPES[shape]
    for field in columns or {}:
        if field not in defaults:
            raise TaskFileError(f"--column {field}=...: {shape} has no field {field!r}; its "
                                f"fields: {', '.join(defaults)}")
    mapping = {**defaults, **(columns or {})}
    rows, dataset = _rows(inner)

    def converted() -> Iterator[tuple[int, Any]]:
        for line, row in rows:
            if isinstance(row, _Problem) or not isinstance(row, dict):
                yield line, row
                continue
            try:
                yield line, {**convert(row, mapping, seed), "dataset": dataset}
            except _Problem as problem:
                yield line, problem

    return _collect(converted(), source, dataset)
