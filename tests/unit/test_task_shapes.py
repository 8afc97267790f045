"""Benchmarks in their own row shapes (engine/tasks/shapes.py), read from the samples shipped in
examples/eval/, and the one-line errors a wrong column gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conductor_engine.engine.rewards import verify
from conductor_engine.engine.tasks.files import TaskFileError
from conductor_engine.engine.tasks.shapes import LETTERS
from conductor_engine.engine.tasks.sources import load_tasks

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "eval"


def test_gpqa_choices_are_shuffled_per_task_with_a_recorded_seed_and_the_letter_is_right() -> None:
    source = f"gpqa:{EXAMPLES / 'gpqa_sample.jsonl'}"
    tasks = load_tasks(source).tasks
    rows = [json.loads(line) for line in (EXAMPLES / "gpqa_sample.jsonl").read_text().splitlines()]
    assert [t.id for t in tasks] == [r["Record ID"] for r in rows]
    for task, row in zip(tasks, rows, strict=True):
        assert task.verifier == "choice" and task.reference in LETTERS[:4]
        assert f"({task.reference}) {row['Correct Answer']}" in task.question
        assert [t for t in task.tags if t.startswith("choice-seed:")]
    assert [t.question for t in load_tasks(source).tasks] == [t.question for t in tasks]
    other = load_tasks(source, seed=1).tasks
    assert [t.question for t in other] != [t.question for t in tasks], "the seed moves choices"


def test_math_reads_the_answer_or_the_last_boxed_value_of_the_solution() -> None:
    tasks = load_tasks(f"math:{EXAMPLES / 'math_sample.jsonl'}").tasks
    assert [t.reference for t in tasks] == ["5", "\\frac{11}{12}", "9"]
    assert all(t.verifier == "math" for t in tasks)
    assert verify("The sum is 11/12.", tasks[1].reference, "math").correct


def test_livecodebench_stdin_cases_become_a_trusted_code_reference() -> None:
    tasks = load_tasks(f"code:{EXAMPLES / 'livecodebench_sample.jsonl'}").tasks
    task = tasks[0]
    assert task.verifier == "code" and len(json.loads(task.reference or "")) == 3
    good = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    verdict = verify(good, task.reference, "code")
    assert verdict.correct and verdict.details.get("trusted", True)
    assert not verify("```python\nprint(3)\n```", task.reference, "code").correct


def test_a_missing_column_is_one_line_naming_the_flag_that_maps_it(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"Problem": "1 + 1?", "answer": "2"}) + "\n")
    loaded = load_tasks(f"math:{path}")
    assert not loaded.tasks and "--column question=NAME" in loaded.errors[0].message
    fixed = load_tasks(f"math:{path}", columns={"question": "Problem"})
    assert fixed.tasks[0].question == "1 + 1?"
    with pytest.raises(TaskFileError, match="has no field 'prompt'"):
        load_tasks(f"math:{path}", columns={"prompt": "Problem"})
