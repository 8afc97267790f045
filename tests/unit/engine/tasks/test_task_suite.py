"""Benchmark suites (engine/tasks/suite.py): the shipped paper suite, sources, task naming."""

from __future__ import annotations

from pathlib import Path

import pytest

from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.tasks.benchmark_shapes import load_shaped
from conductor_engine.engine.tasks.suite import SuiteError, load_suite, shipped
from tests.paths import DATA

SHAPES_DATA = DATA / "shapes"


def test_the_paper_suite_names_each_benchmark_s_hub_source_config_split_and_shape() -> None:
    suite = load_suite("paper")
    assert "paper" in shipped()
    assert [(b.name, b.shape) for b in suite.benchmarks] == [
        ("GPQA-Diamond", "gpqa"), ("LiveCodeBench", "code"), ("MATH500", "math500"),
        ("AIME 2025", "aime")]
    sources = dict((b.key, s) for b, s in suite.sources())
    assert sources["gpqa-diamond"] == "gpqa:hf:Idavidrein/gpqa:gpqa_diamond@train"
    assert sources["math500"] == "math500:hf:HuggingFaceH4/MATH-500@test"
    assert "2512.04388" in suite.citation
    # only the figures the paper's authors stated; the others are left out, not guessed
    assert suite.published() == {"gpqa-diamond": pytest.approx(0.875),
                                 "livecodebench": pytest.approx(0.839)}


def test_a_suite_task_is_renamed_by_benchmark_and_carries_the_suite_s_options() -> None:
    suite = load_suite("paper")
    benchmark = suite.benchmarks[2]
    task = suite.task(benchmark, Task(id="test/prealgebra/1.json", question="1+1?"))
    assert (task.id, task.dataset) == ("math500/test/prealgebra/1.json", "math500")
    assert task.options.step_deadline_s == 3600


def test_a_relative_local_source_is_read_beside_the_suite_file(tmp_path: Path) -> None:
    (tmp_path / "aime.jsonl").write_text((SHAPES_DATA / "aime.jsonl").read_text())
    path = tmp_path / "suite.toml"
    path.write_text('name = "mine"\n[[benchmarks]]\nkey = "aime"\nname = "AIME"\n'
                    'shape = "aime"\nsource = "aime.jsonl"\n')
    (benchmark, source), = load_suite(str(path)).sources()
    assert source == f"aime:{tmp_path / 'aime.jsonl'}"
    loaded = load_shaped(source, limit=1)
    assert [t.id for t in loaded.tasks] == ["2024-I-1"] and not loaded.errors


def test_limit_stops_after_n_tasks_and_still_reports_the_bad_rows_before_them() -> None:
    loaded = load_shaped(f"aime:{SHAPES_DATA / 'aime.jsonl'}", limit=2)
    assert [t.id for t in loaded.tasks] == ["2024-I-1", "2025-I-2"] and not loaded.errors
    mmlu = load_shaped(f"mmlu:{SHAPES_DATA / 'mmlu.jsonl'}", limit=5)
    assert len(mmlu.tasks) == 2 and [e.line for e in mmlu.errors] == [3]


@pytest.mark.parametrize(("text", "message"), [
    ('name = "x"\n[[benchmarks]]\nkey = "a"\nname = "A"\nshape = "nope"\nsource = "s"\n',
     "invalid at benchmarks.0.shape: Value error, unknown shape 'nope'"),
    ('name = "x"\n[options]\nmax_steps = 99\n[[benchmarks]]\nkey = "a"\nname = "A"\n'
     'shape = "aime"\nsource = "s"\n', "max_steps"),
    ('name = "x"\n[[benchmarks]]\nkey = "a"\nname = "A"\nshape = "aime"\nsource = "s"\n'
     '[[benchmarks]]\nkey = "a"\nname = "B"\nshape = "gpqa"\nsource = "t"\n',
     "benchmark keys must be unique; repeated: a"),
    ('name = "x"\n[[benchmarks]\n', "invalid TOML"),
], ids=["unknown-shape", "bad-option", "repeated-key", "bad-toml"])
def test_a_bad_suite_file_is_one_line_naming_the_file(tmp_path: Path, text: str,
                                                      message: str) -> None:
    path = tmp_path / "suite.toml"
    path.write_text(text)
    with pytest.raises(SuiteError, match=None) as raised:
        load_suite(str(path))
    assert str(path) in str(raised.value) and message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_an_unknown_suite_lists_the_shipped_ones() -> None:
    with pytest.raises(SuiteError, match="no suite 'papr'.*shipped suites: paper"):
        load_suite("papr")
