"""Loading tasks from JSONL files and Hugging Face datasets (local ones: there is no network)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.tasks.checks import unstorable_text
from conductor_engine.engine.tasks.files import (
    MAX_LISTED,
    TaskFileError,
    derived_id,
    load_hf,
    load_jsonl,
    load_tasks,
    parse_hf_source,
)

GOOD_AND_BAD = [
    '{"id": "mul", "question": "What is 6 x 7?", "answer": 42, "verifier": "math", '
    '"tags": ["arithmetic"]}',
    "",
    '{"question": "Capital of France?", "answer": "Paris"}',
    '{"id": "broken", "question": "unterminated"',
    '{"id": "no-question", "answer": "7"}',
    '{"id": "typed", "question": "Tags?", "tags": "not-a-list"}',
    '{"id": "mul", "question": "Same id again"}',
    "[1, 2, 3]",
    '{"id": "opts", "question": "Short plan", "options": {"max_steps": 2, "temperature": 0.5}}',
    '{"id": "bad-opts", "question": "x", "options": {"max_steps": 99}}',
    '{"id": "bad-verifier", "question": "x", "verifier": "regex"}',
    '{"id": 7, "question": "Pick one", "reference": "(B)", "dataset": "mc"}',
    '{"id": "both", "question": "x", "answer": "1", "reference": "1"}',
    '{"id": "blank", "question": "   "}',
]


@pytest.fixture
def task_file(tmp_path: Path) -> Path:
    path = tmp_path / "demo.jsonl"
    path.write_text("\n".join(GOOD_AND_BAD) + "\n", encoding="utf-8")
    return path


def test_good_lines_load_and_bad_lines_are_reported_with_their_numbers(task_file: Path) -> None:
    tf = load_jsonl(task_file)
    assert [t.id for t in tf.tasks] == ["mul", derived_id("demo", "Capital of France?"),
                                        "opts", "7"]
    assert [(e.line, e.message) for e in tf.errors] == [
        (4, "invalid JSON: Expecting ',' delimiter (column 44)"),
        (5, "field question: missing"),
        (6, "field tags: Input should be a valid list"),
        (7, "field id: duplicate 'mul', first on line 1"),
        (8, "expected a JSON object, got list"),
        (10, "field options.max_steps: Input should be less than or equal to 20"),
        (11, "field verifier: unknown 'regex'; valid: auto, exact, choice, math, code"),
        (13, 'field answer: give "answer" or "reference", not both'),
        (14, "field question: empty"),
    ]
    assert tf.path == str(task_file)


def test_fields_map_onto_tasks(task_file: Path) -> None:
    tasks = {t.id: t for t in load_jsonl(task_file).tasks}
    mul = tasks["mul"]
    assert (mul.question, mul.reference, mul.verifier, mul.tags, mul.dataset) == (
        "What is 6 x 7?", "42", "math", ["arithmetic"], "demo")
    assert (tasks["opts"].options.max_steps, tasks["opts"].options.temperature) == (2, 0.5)
    assert (tasks["7"].reference, tasks["7"].dataset) == ("(B)", "mc")


def test_dataset_name_can_be_given(task_file: Path) -> None:
    tasks = load_jsonl(task_file, dataset="bench").tasks
    assert {t.dataset for t in tasks} == {"bench", "mc"}
    assert derived_id("bench", "Capital of France?") in {t.id for t in tasks}


def test_derived_ids_are_stable_across_reordering(tmp_path: Path) -> None:
    lines = [json.dumps({"question": q}) for q in ("one?", "two?", "three?")]
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("\n".join(lines))
    second.write_text("\n".join(reversed(lines)))
    ids = {t.question: t.id for t in load_jsonl(first, dataset="d").tasks}
    assert ids == {t.question: t.id for t in load_jsonl(second, dataset="d").tasks}


def test_a_repeated_question_without_ids_is_a_duplicate(tmp_path: Path) -> None:
    path = tmp_path / "dup.jsonl"
    path.write_text('{"question": "same?"}\n{"question": "same?"}\n')
    tf = load_jsonl(path)
    assert len(tf.tasks) == 1
    assert tf.errors[0].line == 2 and "same derived id" in tf.errors[0].message


def test_invalid_utf8_is_a_line_error_naming_line_and_byte(tmp_path: Path) -> None:
    path = tmp_path / "bytes.jsonl"
    path.write_bytes(b'{"question": "fine"}\n{"question": "\xff"}\n')
    tf = load_jsonl(path)
    assert len(tf.tasks) == 1
    assert tf.error_lines() == [f"{path}:2: not UTF-8: invalid start byte at byte 14 of the "
                                "line; save the file as UTF-8"]


def test_a_byte_order_mark_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"question": "fine"}\r\n{"question": "also"}\r\n')
    tf = load_jsonl(path)
    assert [t.question for t in tf.tasks] == ["fine", "also"] and tf.errors == []


@pytest.mark.parametrize(("line", "field"), [
    (r'{"id": "a\u0000", "question": "q"}', "id"),
    (r'{"question": "q", "tags": ["ok", "b\u0000d"]}', "tags.1"),
    (r'{"question": "q", "dataset": "d\u0000"}', "dataset"),
    (r'{"question": "q\u0000"}', "question"),
    (r'{"question": "q", "answer": "\u0000"}', "answer"),
    (r'{"question": "a\ud800b"}', "question"),
    (r'{"question": "q", "tags": ["\udfff"]}', "tags.0"),
    (r'{"question": "q", "verifier": "math\u0000"}', "verifier"),
    (r'{"id": "x\ud800", "question": "q"}', "id"),
    (r'{"question": "q", "dataset": "\udc80"}', "dataset"),
    (r'{"question": "q", "tags": ["ok", "\ud83d"]}', "tags.1"),
    (r'{"question": "q", "reference": "\ud800"}', "reference"),
])
def test_text_postgresql_cannot_store_is_a_line_error_naming_the_field(
        tmp_path: Path, line: str, field: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"question": "fine"}\n' + line + "\n", encoding="utf-8")
    tf = load_jsonl(path)
    assert [t.question for t in tf.tasks] == ["fine"]
    [error] = tf.error_lines()
    assert error.startswith(f"{path}:2: field {field}: holds a "), error
    assert ("NUL" in error) != ("surrogate" in error)


def test_a_file_name_that_cannot_be_a_dataset_name_is_used_only_where_no_line_names_one(
        tmp_path: Path) -> None:
    path = tmp_path / "t\udcff.jsonl"  # a name whose bytes are not UTF-8 (b"t\xff.jsonl")
    path.write_text('{"question": "q", "dataset": "named"}\n{"question": "r"}\n')
    tf = load_jsonl(path)
    assert [t.dataset for t in tf.tasks] == ["named"]
    [error] = tf.errors
    assert error.line == 2 and error.message.startswith(
        "field dataset: not given, and the default, the file's name, holds a lone surrogate")
    assert error.message.endswith('give "dataset" or rename the file')
    assert load_jsonl(path, dataset="given").errors == []


def test_every_string_of_a_task_is_checked_nested_ones_and_keys_too() -> None:
    assert unstorable_text({"a": [{"b": "ok"}, {"c": ["x", "y\x00"]}]}) is not None
    assert unstorable_text({"a": [{"b": "ok"}, {"c": ["x", "y\x00"]}]})[0] == "a.1.c.1"
    assert unstorable_text({"k\ud800": 1})[0] == "'k\\ud800'"  # type: ignore[index]
    assert unstorable_text(Task(question="fine", tags=["é", "😀"])) is None


def test_any_hostile_line_is_one_printable_line_never_an_exception(tmp_path: Path) -> None:
    """Lone surrogates, NUL and markup wherever JSON can put them: each bad line is one
    line of UTF-8 text naming it, and the load never raises."""
    bits = ['"\\ud800"', '"\\u0000"', '"[/code]\\n"', '["\\udfff"]', '{"\\ud800": 1}', "1e999",
            "null", '"\\\\"']
    lines: list[str] = []
    for bit in bits:
        for key in ("id", "question", "answer", "reference", "tags", "dataset", "verifier",
                    "options", "\\ud800"):
            lines.append(f'{{"question": "q-{len(lines)}", "{key}": {bit}}}')
    lines += ['{"question": "q", "options": {"policy_version": "\\ud800"}}', "\\ud800", '"\\ud800']
    path = tmp_path / "hostile.jsonl"
    path.write_text("\n".join(lines) + "\n")
    tf = load_jsonl(path)
    assert tf.errors
    for line in tf.error_lines(None):
        assert "\n" not in line and line.startswith(f"{path}:")
        line.encode("utf-8")  # printable: no lone surrogate of the input repeated in it
        assert "\x00" not in line
    for task in tf.tasks:
        task.model_dump_json().encode("utf-8")


def test_a_line_nested_too_deep_or_with_a_huge_integer_is_a_line_error(tmp_path: Path) -> None:
    """The standard parser raises RecursionError and ValueError there, not JSONDecodeError:
    each is the line's error, and the lines around it still load."""
    deep = "[" * 100_000 + "]" * 100_000
    path = tmp_path / "parser.jsonl"
    path.write_text("\n".join([
        '{"question": "first"}', f'{{"question": "q", "x": {deep}}}',
        f'{{"question": "q", "answer": {"9" * 5000}}}', '{"question": "last"}']) + "\n")
    tf = load_jsonl(path)
    assert [t.question for t in tf.tasks] == ["first", "last"]
    assert [e.line for e in tf.errors] == [2, 3]
    assert all(e.message.startswith("cannot be read as JSON: ") for e in tf.errors)
    assert "4300" in tf.errors[1].message and len(tf.errors[1].message) < 200


def test_a_task_over_the_bound_and_a_line_over_the_bound_are_line_errors(tmp_path: Path) -> None:
    from conductor_engine.engine.contracts.limits import MAX_JSON_REQUEST_BYTES, MAX_TASK_BYTES

    path = tmp_path / "big.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in [
        {"question": "fine"}, {"question": "x" * MAX_TASK_BYTES},
        {"question": "\u00e9" * (MAX_JSON_REQUEST_BYTES // 6 + 1)}]) + "\n")  # escaped: 6x
    tf = load_jsonl(path)
    assert [t.question for t in tf.tasks] == ["fine"]
    assert [e.line for e in tf.errors] == [2, 3]
    assert "(1.0 MiB) as JSON, over the 1,048,576 bytes (1.0 MiB) a task may be" in (
        tf.errors[0].message)
    assert tf.errors[1].message.startswith("the line is 8,388,6")


def test_bad_lines_are_listed_with_file_and_line_then_summed_up(tmp_path: Path) -> None:
    path = tmp_path / "many.jsonl"
    path.write_text('{"question": "ok"}\n' + "{oops\n" * 60)
    tf = load_jsonl(path)
    lines = tf.error_lines()
    assert len(tf.errors) == 60 and len(lines) == MAX_LISTED + 1
    assert lines[0].startswith(f"{path}:2: invalid JSON")
    assert "10 more bad line(s) (60 in all)" in lines[-1] and "--all" in lines[-1]
    assert len(tf.error_lines(None)) == 60


def test_a_missing_file_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(TaskFileError, match="not found: give the path of a JSONL file"):
        load_tasks(str(tmp_path / "nope.jsonl"))


@pytest.mark.parametrize(("source", "expected"), [
    ("hf:gsm8k", ("gsm8k", None, None)),
    ("hf:openai/gsm8k:main@test", ("openai/gsm8k", "main", "test")),
    ("hf:cais/mmlu:all", ("cais/mmlu", "all", None)),
    ("hf:./data/saved@validation", ("./data/saved", None, "validation")),
])
def test_hf_sources_name_dataset_config_and_split(
        source: str, expected: tuple[str, str | None, str | None]) -> None:
    assert parse_hf_source(source) == expected


# --- Hugging Face datasets, saved locally --------------------------------------------------

@pytest.fixture
def datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The `datasets` package (an optional extra), with its cache inside the test and the
    network off."""
    module = pytest.importorskip("datasets")
    monkeypatch.setattr(module.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    monkeypatch.setattr(module.config, "HF_HUB_OFFLINE", True)
    return module


@pytest.fixture
def saved_dataset(tmp_path: Path, datasets: Any) -> Path:
    rows = [
        {"problem": "What is 1+1?", "solution": 2, "uid": "r0", "topic": "add"},
        {"problem": None, "solution": 3, "uid": "r1", "topic": "add"},
        {"problem": "What is 2*3?", "solution": 6, "uid": "r2", "topic": "mul"},
        {"problem": "What is 9-4?", "solution": 5, "uid": "r3", "topic": "sub"},
    ]
    path = tmp_path / "arith"
    datasets.DatasetDict(test=datasets.Dataset.from_list(rows)).save_to_disk(str(path))
    return path


def test_hf_dataset_with_a_column_mapping(saved_dataset: Path) -> None:
    tf = load_tasks(f"hf:{saved_dataset}", columns={"problem": "question",
                                                     "solution": "answer", "uid": "id"},
                    verifier="math")
    assert [(t.id, t.question, t.reference, t.verifier, t.dataset) for t in tf.tasks] == [
        ("r0", "What is 1+1?", "2", "math", "arith"),
        ("r2", "What is 2*3?", "6", "math", "arith"),
        ("r3", "What is 9-4?", "5", "math", "arith"),
    ]
    assert [(e.line, e.message) for e in tf.errors] == [(1, "field question: missing")]
    assert tf.path == f"hf:{saved_dataset}@test"


def test_a_dataset_row_postgresql_cannot_store_names_row_and_field(
        tmp_path: Path, datasets: Any) -> None:
    rows = [{"question": "fine", "tags": ["a"]}, {"question": "q", "tags": ["a", "b\x00"]}]
    path = tmp_path / "rows"
    datasets.DatasetDict(test=datasets.Dataset.from_list(rows)).save_to_disk(str(path))
    tf = load_tasks(f"hf:{path}")
    assert [t.question for t in tf.tasks] == ["fine"]
    [error] = tf.error_lines()
    assert error.startswith(f"hf:{path}@test:1: field tags.1: holds a NUL character")


def test_hf_limit_and_unknown_split(saved_dataset: Path) -> None:
    cols = {"problem": "question", "solution": "answer"}
    assert len(load_hf(str(saved_dataset), columns=cols, limit=1).tasks) == 1
    with pytest.raises(TaskFileError, match="no split 'train'; it has test"):
        load_hf(str(saved_dataset), split="train", columns=cols)


def test_hf_mapping_mistakes_are_explained(saved_dataset: Path) -> None:
    with pytest.raises(TaskFileError, match="no question column"):
        load_hf(str(saved_dataset))
    with pytest.raises(TaskFileError, match="'problem' is not a task field"):
        load_hf(str(saved_dataset), columns={"question": "problem"})
    with pytest.raises(TaskFileError, match="column 'prompt' is not in the dataset"):
        load_hf(str(saved_dataset), columns={"prompt": "question"})


def test_hf_reads_a_local_data_file(tmp_path: Path, datasets: Any) -> None:
    path = tmp_path / "qa.jsonl"
    path.write_text('{"q": "Capital of France?", "a": "Paris"}\n'
                    '{"q": "Capital of Italy?", "a": "Rome"}\n')
    tf = load_tasks(f"hf:{path}@train", columns={"q": "question", "a": "answer"})
    assert [(t.question, t.reference, t.dataset) for t in tf.tasks] == [
        ("Capital of France?", "Paris", "qa"), ("Capital of Italy?", "Rome", "qa")]
    assert tf.errors == []


def test_hf_unknown_dataset_is_a_clear_error(datasets: Any) -> None:
    with pytest.raises(TaskFileError, match="cannot load dataset 'no-such-org/no-such-set'"):
        load_tasks("hf:no-such-org/no-such-set")
