"""Benchmarks in their own row shapes (engine/tasks/benchmark_shapes.py), read from the samples
shipped in examples/eval/, and the one-line errors a wrong column gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conductor_engine.engine.rewards import verify
from conductor_engine.engine.rewards.code_tests import parse_reference
from conductor_engine.engine.tasks.benchmark_shapes import LETTERS
from conductor_engine.engine.tasks.files import TaskFileError
from conductor_engine.engine.tasks.sources import load_tasks
from tests.paths import DATA, ROOT

EXAMPLES = ROOT / "examples" / "eval"


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


# --- the published shapes (tests/data/shapes/, written by make_rows.py) --------------------

ROWS = DATA / "shapes"


def test_mmlu_choices_keep_their_order_and_the_answer_index_becomes_the_letter() -> None:
    loaded = load_tasks(f"mmlu:{ROWS / 'mmlu.jsonl'}")
    assert [t.reference for t in loaded.tasks] == ["C", "B"]
    assert "(C) Paris" in loaded.tasks[0].question and loaded.tasks[0].tags == ["geography"]
    assert verify("Answer: C", loaded.tasks[0].reference, "choice").correct
    assert not verify("Answer: A", loaded.tasks[0].reference, "choice").correct
    assert [(e.line, e.message) for e in loaded.errors] == [
        (3, "answer 7 is not a letter or index of the 2 choices")]


def test_mmlu_pro_reads_up_to_ten_options_and_the_answer_letter() -> None:
    tasks = load_tasks(f"mmlu-pro:{ROWS / 'mmlu_pro.jsonl'}").tasks
    assert [(t.id, t.reference, t.verifier) for t in tasks] == [("70", "I", "choice"),
                                                                 ("71", "C", "choice")]
    assert "(J) 100 J" in tasks[0].question and "(I) 90 J" in tasks[0].question
    assert verify("The answer is (I).", tasks[0].reference, "choice").correct


def test_aime_reads_both_column_spellings_and_wants_an_integer() -> None:
    loaded = load_tasks(f"aime:{ROWS / 'aime.jsonl'}")
    assert [(t.id, t.reference) for t in loaded.tasks] == [("2024-I-1", "24"), ("2025-I-2", "42")]
    assert [e.line for e in loaded.errors] == [3] and "not an integer" in loaded.errors[0].message
    assert verify("so \\boxed{042}", loaded.tasks[1].reference, "math").correct
    assert not verify("so \\boxed{41}", loaded.tasks[1].reference, "math").correct


def test_math500_rows_are_math_rows() -> None:
    task = load_tasks(f"math500:{ROWS / 'math500.jsonl'}").tasks[0]
    assert (task.id, task.reference, task.verifier) == ("test/prealgebra/1.json", "\\frac{5}{6}",
                                                        "math")
    assert verify("It is $\\boxed{\\dfrac{5}{6}}$", task.reference, "math").correct
    assert not verify("It is $\\boxed{\\dfrac{1}{5}}$", task.reference, "math").correct


def test_rlpr_takes_the_user_message_and_judges_free_form_answers_by_auto() -> None:
    tasks = load_tasks(f"rlpr:{ROWS / 'rlpr.jsonl'}").tasks
    assert [t.question for t in tasks] == ["What is the SI unit of force?", "Simplify 2x + 3x."]
    assert [t.tags for t in tasks][0] == ["WebInstruct-verified", "physics"]
    text, algebra = tasks
    said = verify("Answer: The Newton", text.reference, text.verifier)
    assert said.correct and said.verifier == "exact", "words: normalised text"
    assert not verify("Answer: the joule", text.reference, text.verifier).correct
    solved = verify("So $\\boxed{x \\cdot 5}$", algebra.reference, algebra.verifier)
    assert solved.correct and solved.verifier == "math", "math where it parses"
    assert not verify("So $\\boxed{6x}$", algebra.reference, algebra.verifier).correct


def test_gpqa_diamond_rows_with_all_their_columns_still_load() -> None:
    task = load_tasks(f"gpqa:{ROWS / 'gpqa_diamond.jsonl'}").tasks[0]
    assert task.id == "recGPQA0001" and f"({task.reference}) Gluon" in task.question


def test_humaneval_check_asserts_become_trusted_call_cases_judged_in_the_sandbox() -> None:
    trusted, loose = load_tasks(f"humaneval:{ROWS / 'humaneval.jsonl'}").tasks
    assert trusted.id == "HumanEval/900" and "def evens(numbers: List[int])" in trusted.question
    tests = parse_reference(trusted.reference or "")
    assert tests.form == "call" and tests.trusted
    assert [(c.function, c.args, c.expected) for c in tests.calls] == [
        ("evens", [[]], []), ("evens", [[1, 2, 3, 4]], [2, 4]), ("evens", [[-2, 7]], [-2])]
    right = ("```python\nfrom typing import List\n\n\ndef evens(numbers: List[int]) -> "
             "List[int]:\n    return [n for n in numbers if n % 2 == 0]\n```")
    verdict = verify(right, trusted.reference, "code")
    assert (verdict.correct, verdict.details["trusted"]) == (True, True), verdict.reason
    wrong = verify(right.replace("== 0", "== 1"), trusted.reference, "code")
    assert (wrong.correct, wrong.details["trusted"]) == (False, True)
    assert "expected [], got" not in wrong.reason and "#2: expected [2, 4]" in wrong.reason


def test_humaneval_tests_that_cannot_be_turned_run_as_they_are_and_say_untrusted() -> None:
    loose = load_tasks(f"humaneval:{ROWS / 'humaneval.jsonl'}").tasks[1]
    assert parse_reference(loose.reference or "").form == "asserts"
    verdict = verify("```python\ndef half(x):\n    return x / 2\n```", loose.reference, "code")
    assert verdict.correct and verdict.details["trusted"] is False
    assert not verify("```python\ndef half(x):\n    return x\n```", loose.reference,
                      "code").correct


def test_mbpp_literal_asserts_are_trusted_and_the_rest_stay_untrusted() -> None:
    literal, loose = load_tasks(f"mbpp:{ROWS / 'mbpp.jsonl'}").tasks
    assert "assert bigger(1, 2) == 2" in literal.question, "MBPP's prompt shows its tests"
    assert parse_reference(literal.reference or "").trusted
    tests = parse_reference(loose.reference or "")
    assert (tests.form, tests.asserts.splitlines()[0]) == ("asserts", "import math")
