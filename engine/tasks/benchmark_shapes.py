"""Benchmarks in their own row shapes, read as tasks: `SHAPE:SOURCE`, where SOURCE is a JSONL
file or `hf:NAME[:CONFIG][@SPLIT]`, and SHAPE one of:

- `gpqa`: GPQA-style multiple choice. Columns `Question`, `Correct Answer`, `Incorrect Answer
  1..3` (and `Record ID`). The choices are shuffled per task with a seed derived from the eval
  seed and the row, recorded as the task's tag `choice-seed:N`, so a rerun asks the same
  question in the same order; the reference is the right letter, verifier `choice`.
- `math`: MATH-style answers. Columns `problem` and `answer`, or `solution` whose last
  `\\boxed{}` is the answer; verifier `math` (math-verify).
- `math500`: the same as `math` (MATH500's rows are MATH's: `problem`, `answer`, `unique_id`).
- `code`: LiveCodeBench. Columns `question_content`, `starter_code`, `public_test_cases`,
  `private_test_cases` (JSON, or compressed as published), `metadata` (`func_name`); stdin
  problems and functional (LeetCode) ones both become references judged by trusted code
  (engine/tasks/livecodebench.py says how).
- `mmlu` / `mmlu-pro`: multiple choice in the published order. MMLU: `question`, `choices`,
  `answer` (an index); MMLU-Pro: `question`, `options` (up to 10), `answer` (a letter) or
  `answer_index`, `category`, `question_id`. Verifier `choice`.
- `aime`: `Problem`/`Answer` (or `problem`/`answer`, `question`), `ID`/`id`; the answer must be
  an integer, verifier `math`.
- `rlpr`: verl-style rows: `prompt` (chat messages; the last user message is the question),
  `reward_model.ground_truth` (free-form), `data_source` and `ability` as tags; verifier `auto`
  (math-verify where the reference reads as math and parses, normalised text otherwise).
- `humaneval`: `prompt`, `entry_point`, `test` (`def check(candidate)`), `task_id`; verifier
  `code`, trusted call cases where every assert compares a call with a literal.
- `mbpp`: `text` (or sanitized's `prompt`), `test_list`, `test_imports`, `test_setup_code`,
  `task_id`; verifier `code`, trusted as for HumanEval.

A default column may list alternatives (`Problem|problem`: the first the row has) and reach into
nested objects (`reward_model.ground_truth`).
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
                "difficulty": "difficulty", "platform": "platform"}

MMLU_COLUMNS = {"id": "id", "question": "question", "choices": "choices", "answer": "answer",
                "answer_index": "answer_index", "subject": "subject"}
MMLU_PRO_COLUMNS = {"id": "question_id", "question": "question", "choices": "options",
                    "answer": "answer", "answer_index": "answer_index", "subject": "category"}
AIME_COLUMNS = {"id": "ID|id", "question": "Problem|problem|question",
                "answer": "Answer|answer"}
HUMANEVAL_COLUMNS = {"id": "task_id", "question": "prompt", "entry_point": "entry_point",
                     "test": "test"}
MBPP_COLUMNS = {"id": "task_id", "question": "text|prompt", "tests": "test_list",
                "imports": "test_imports", "setup": "test_setup_code"}
RLPR_COLUMNS = {"id": "id", "question": "prompt",
                "answer": "reward_model.ground_truth", "source": "data_source",
                "ability": "ability"}


def _lookup(row: dict[str, Any], column: str) -> Any:
    """A column's value; a dotted name reaches into nested objects (`reward_model.ground_truth`)
    where the row has no column of that exact name."""
    if column in row or "." not in column:
        return row.get(column)
    value: Any = row
    for part in column.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _get(row: dict[str, Any], columns: dict[str, str], field: str) -> Any:
    """The field's value, from its column or, for a field whose default names several columns
    (`Problem|problem`), the first of them the row has."""
    if field not in columns:
        return None
    for column in columns[field].split("|"):
        value = _lookup(row, column)
        if value is not None and value != "":
            return value
    return None


def _need(row: dict[str, Any], columns: dict[str, str], field: str) -> Any:
    value = _get(row, columns, field)
    if value is None:
        raise _Problem(f"column {columns[field]!r} (the {field}) is missing or empty; map "
                       f"another column to it with --column {field}=NAME")
    return value


def choice_seed(seed: int, key: str) -> int:
    digest = hashlib.sha256(f"{seed}\x1f{key}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def _choice_text(question: str, choices: list[str]) -> str:
    lines = [f"({LETTERS[i]}) {c}" for i, c in enumerate(choices)]
    return (f"{question}\n\n" + "\n".join(lines)
            + "\n\nAnswer with the letter of the correct choice, as 'Answer: X'.")


def _answer_index(answer: Any, count: int) -> int:
    """A multiple-choice answer as a 0-based index: an index (int or digits) or a letter."""
    if isinstance(answer, bool):
        raise _Problem(f"answer {answer!r} is neither an index nor a letter")
    if isinstance(answer, str) and answer.strip().isdigit():
        answer = int(answer.strip())
    if isinstance(answer, str) and len(answer.strip()) == 1 and answer.strip() in LETTERS:
        answer = LETTERS.index(answer.strip())
    if not isinstance(answer, int) or not 0 <= answer < count:
        raise _Problem(f"answer {answer!r} is not a letter or index of the {count} choices")
    return answer


def choices_row(row: dict[str, Any], columns: dict[str, str], seed: int) -> dict[str, Any]:
    """MMLU (`choices`, `answer` an index) and MMLU-Pro (`options`, `answer` a letter,
    `answer_index`): the choices in the published order, the reference their right letter."""
    question = str(_need(row, columns, "question")).strip()
    choices = _need(row, columns, "choices")
    if not isinstance(choices, list) or not all(isinstance(c, str | int | float)
                                                for c in choices):
        raise _Problem(f"column {columns['choices']!r}: expected a list of choices")
    if not 2 <= len(choices) <= len(LETTERS):
        raise _Problem(f"{len(choices)} choices: a row has 2 to {len(LETTERS)}")
    answer = _get(row, columns, "answer")
    index = _answer_index(answer if answer is not None else _need(row, columns, "answer_index"),
                          len(choices))
    out: dict[str, Any] = {"question": _choice_text(question, [str(c).strip() for c in choices]),
                           "answer": LETTERS[index], "verifier": "choice",
                           "tags": [str(v) for v in [_get(row, columns, "subject")] if v]}
    if (rid := _get(row, columns, "id")) is not None:
        out["id"] = str(rid)
    return out


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
    out: dict[str, Any] = {"question": _choice_text(question, choices),
                           "answer": LETTERS[choices.index(correct)],
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


def aime_row(row: dict[str, Any], columns: dict[str, str], seed: int) -> dict[str, Any]:
    """AIME: the answer is an integer (000-999); the reference is it without leading zeros,
    judged by math-verify, so a reply's `042` or `\\boxed{42}` matches `42` and `42.5` not."""
    answer = str(_need(row, columns, "answer")).strip()
    if not answer.isdigit():
        raise _Problem(f"answer {answer!r} is not an integer: AIME answers are 0 to 999")
    out: dict[str, Any] = {"question": str(_need(row, columns, "question")),
                           "answer": str(int(answer)), "verifier": "math"}
    if (rid := _get(row, columns, "id")) is not None:
        out["id"] = str(rid)
    return out


def _user_text(prompt: Any) -> str | None:
    """A chat-format prompt's last user message (verl-style datasets), or a plain string."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        users = [m.get("content") for m in prompt if isinstance(m, dict)
                 and m.get("role") == "user" and isinstance(m.get("content"), str)]
        return users[-1] if users else None
    return None


def rlpr_row(row: dict[str, Any], columns: dict[str, str], seed: int) -> dict[str, Any]:
    """RLPR: a chat prompt and a free-form reference (`reward_model.ground_truth`), judged by
    the `auto` verifier: math-verify where the reference reads as math and parses, normalised
    text equality otherwise (a single letter: the choice verifier)."""
    question = _user_text(_need(row, columns, "question"))
    if question is None or not question.strip():
        raise _Problem(f"column {columns['question']!r}: no user message")
    out: dict[str, Any] = {"question": question, "verifier": "auto",
                           "answer": str(_need(row, columns, "answer")).strip(),
                           "tags": [str(v) for f in ("source", "ability")
                                    if (v := _get(row, columns, f)) is not None]}
    if (rid := _get(row, columns, "id")) is not None:
        out["id"] = str(rid)
    return out


def humaneval_row(row: dict[str, Any], columns: dict[str, str], seed: int) -> dict[str, Any]:
    """HumanEval: complete `prompt`; the reference is `test` then `check(entry_point)`, which
    code_tests reads as trusted call cases where every assert of `check` is
    `candidate(literals) == literal`, and runs as untrusted asserts otherwise."""
    prompt, entry = str(_need(row, columns, "question")), str(_need(row, columns, "entry_point"))
    if not entry.isidentifier():
        raise _Problem(f"entry point {entry!r} is not a Python name")
    question = ("Complete the following Python function. Give the complete code, the imports "
                "and any helper functions shown included, in one ```python block.\n\n"
                f"```python\n{prompt.rstrip()}\n```")
    out: dict[str, Any] = {"question": question, "verifier": "code",
                           "answer": f"{str(_need(row, columns, 'test')).rstrip()}\n\n\n"
                                     f"check({entry})\n"}
    if (rid := _get(row, columns, "id")) is not None:
        out["id"] = str(rid)
    return out


def mbpp_row(row: dict[str, Any], columns: dict[str, str], seed: int) -> dict[str, Any]:
    """MBPP (full and sanitized): the task text and, as MBPP's own prompt does, its tests; the
    reference is the setup code, test imports and `test_list` asserts, read by code_tests
    (trusted call cases where each is `assert f(literals) == literal`)."""
    tests = _need(row, columns, "tests")
    if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests) or not tests:
        raise _Problem(f"column {columns['tests']!r}: expected a list of assert lines")
    imports = _get(row, columns, "imports") or []
    if not isinstance(imports, list) or not all(isinstance(t, str) for t in imports):
        raise _Problem(f"column {columns['imports']!r}: expected a list of import lines")
    setup = str(_get(row, columns, "setup") or "")
    shown = "\n".join(tests)
    question = (f"{str(_need(row, columns, 'question')).strip()}\n\nYour code should pass "
                f"these tests:\n\n```python\n{shown}\n```\n\nGive your solution in one "
                "```python block.")
    reference = "\n".join([*imports, setup, *tests]).strip() + "\n"
    out: dict[str, Any] = {"question": question, "answer": reference, "verifier": "code"}
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
    out["tags"] = [str(v) for f in ("difficulty", "platform")
                   if (v := _get(row, columns, f)) is not None]
    return out


Shape = tuple[dict[str, str], Callable[[dict[str, Any], dict[str, str], int], dict[str, Any]]]
SHAPES: dict[str, Shape] = {
    "gpqa": (GPQA_COLUMNS, gpqa_row), "math": (MATH_COLUMNS, math_row),
    "math500": (MATH_COLUMNS, math_row), "code": (CODE_COLUMNS, code_row),
    "mmlu": (MMLU_COLUMNS, choices_row), "mmlu-pro": (MMLU_PRO_COLUMNS, choices_row),
    "aime": (AIME_COLUMNS, aime_row), "rlpr": (RLPR_COLUMNS, rlpr_row),
    "humaneval": (HUMANEVAL_COLUMNS, humaneval_row), "mbpp": (MBPP_COLUMNS, mbpp_row),
}



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
                seed: int = 0, limit: int | None = None) -> TaskFile:
    """Tasks from `SHAPE:SOURCE` (module docstring); TaskFileError for an unknown shape or
    column name, or a source that cannot be read. `limit` stops after that many rows have
    converted (a cheap first run: `conductor eval --limit N`), so the rest of a large
    benchmark (LiveCodeBench's compressed tests) is never decoded; bad rows met before then
    are still reported."""
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
        taken = 0
        for line, row in rows:
            if limit is not None and taken >= limit:
                return
            if isinstance(row, _Problem) or not isinstance(row, dict):
                yield line, row
                continue
            try:
                task = {**convert(row, mapping, seed), "dataset": dataset}
            except _Problem as problem:
                yield line, problem
                continue
            taken += 1
            yield line, task

    return _collect(converted(), source, dataset)
