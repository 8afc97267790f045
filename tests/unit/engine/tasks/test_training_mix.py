"""Training mixes (engine/tasks/mix.py) and `conductor train start MIX.toml`: the paper's mix
reads, the draw is fixed by the seed, and a mix holding a held-out problem is refused."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.tasks.mix import MixSource, draw, load_mix, overlap
from conductor_engine.engine.tasks.suite import SuiteError
from conductor_engine.runtime.cli import app
from conductor_engine.runtime.client import ConductorClient
from tests.paths import ROOT

SHAPES_DATA = ROOT / "tests" / "data" / "shapes"


def test_the_paper_mix_is_960_problems_of_math_mmlu_rlpr_and_livecodebench() -> None:
    mix = load_mix(ROOT / "examples" / "paper" / "train_mix.toml")
    assert mix.total == sum(s.count for s in mix.sources) == 960
    assert [s.shape for s in mix.sources] == ["math", "mmlu", "rlpr", "code"]
    assert mix.heldout == ["paper"]


def test_counts_that_miss_the_total_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "mix.toml"
    path.write_text('name = "m"\ntotal = 5\n[[sources]]\nkey = "a"\nname = "A"\n'
                    'shape = "aime"\nsource = "a.jsonl"\ncount = 4\n')
    with pytest.raises(SuiteError, match="the counts add up to 4, not total = 5"):
        load_mix(path)


def test_the_draw_is_fixed_by_the_seed_and_tags_each_task_with_its_source() -> None:
    tasks = [Task(id=str(i), question=f"q{i}", tags=["algebra"]) for i in range(50)]
    source = MixSource(key="math", name="MATH", shape="math", source="x", count=10)
    first = draw(source, tasks, seed=0)
    assert [t.id for t in first] == [t.id for t in draw(source, list(reversed(tasks)), seed=0)]
    assert [t.id for t in first] != [t.id for t in draw(source, tasks, seed=1)]
    assert all(t.id.startswith("math/") and t.tags == ["math", "algebra"] and
               t.dataset == "math" for t in first)
    with pytest.raises(SuiteError, match="MATH: 50 valid task.*fewer than the count 60"):
        draw(source.model_copy(update={"count": 60}), tasks, seed=0)


def test_overlap_is_by_row_id_among_alike_tasks_or_by_question_text() -> None:
    held = [Task(id="livecodebench/3999", question="Two sum.", dataset="livecodebench",
                 verifier="code"),
            Task(id="math500/test/a.json", question="Compute  $1+1$.", dataset="math500",
                 verifier="math")]
    mix = [Task(id="lcb/3999", question="Two sum, reworded.", dataset="lcb", verifier="code"),
           Task(id="math/m-1", question="compute $1+1$.", dataset="math", verifier="math"),
           Task(id="mmlu/3999", question="Other.", dataset="mmlu", verifier="choice")]
    assert overlap(mix, held) == [
        "lcb/3999 has the id of held-out livecodebench/3999",
        "math/m-1 has the question of held-out math500/test/a.json"]


def _mix_dir(tmp_path: Path, mix_aime: str) -> Path:
    for name in ("aime.jsonl", "math500.jsonl"):
        shutil.copy(SHAPES_DATA / name, tmp_path / name)
    (tmp_path / "mix_aime.jsonl").write_text(mix_aime)
    (tmp_path / "heldout.toml").write_text(
        'name = "held"\n[[benchmarks]]\nkey = "aime-2025"\nname = "AIME 2025"\nshape = "aime"\n'
        'source = "aime.jsonl"\n')
    path = tmp_path / "mix.toml"
    path.write_text('name = "m"\ntotal = 2\nheldout = ["heldout.toml"]\n'
                    '[[sources]]\nkey = "aime-old"\nname = "AIME (old)"\nshape = "aime"\n'
                    'source = "mix_aime.jsonl"\ncount = 1\n'
                    '[[sources]]\nkey = "math"\nname = "MATH"\nshape = "math"\n'
                    'source = "math500.jsonl"\ncount = 1\n')
    return path


class _Connected(Exception):
    """Raised where `train start` would connect: the mix was accepted."""


@pytest.fixture
def no_temporal(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)

    async def connect(*args: Any, **kwargs: Any) -> None:
        raise _Connected

    monkeypatch.setattr(ConductorClient, "connect", connect)


def test_train_start_refuses_a_mix_holding_a_held_out_problem(tmp_path: Path,
                                                             no_temporal: None) -> None:
    path = _mix_dir(tmp_path, '{"id": "2025-I-2", "problem": "Same id, other words?", '
                              '"answer": "42"}\n')
    result = CliRunner().invoke(app, ["train", "start", str(path)], env={"COLUMNS": "400"})
    assert result.exit_code == 1, result.output
    error = result.stderr.splitlines()[-1]
    assert error.startswith("error: the training mix holds 1 problem(s) of the held-out "
                            f"suite(s) {tmp_path / 'heldout.toml'}: aime-old/2025-I-2 has the "
                            "id of held-out aime-2025/2025-I-2"), error


def test_train_start_draws_a_mix_that_keeps_the_held_out_suite_out(tmp_path: Path,
                                                                  no_temporal: None) -> None:
    path = _mix_dir(tmp_path, '{"id": "1983-1", "problem": "A new problem?", "answer": "7"}\n'
                              '{"id": "1983-2", "problem": "Not an integer?", "answer": "2.5"}\n')
    result = CliRunner().invoke(app, ["train", "start", str(path)], env={"COLUMNS": "400"})
    assert isinstance(result.exception, _Connected), result.output
    assert (f"warning: 1 bad row(s) in aime:{tmp_path / 'mix_aime.jsonl'} left out of the "
            "draw; 1 valid") in result.stderr
    assert "held out: none of 2 task(s) of" in result.stderr
    assert "AIME (old): 1 of 1 task(s)" in result.stderr
