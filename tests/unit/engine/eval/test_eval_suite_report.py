"""The paper-shaped table of a suite eval (engine/eval/suite_report.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conductor_engine.engine.contracts.traces import Trace
from conductor_engine.engine.eval.suite_report import (
    cells,
    header,
    markdown,
    suite_rows,
    write_suite_report,
)
from conductor_engine.engine.tasks.suite import load_suite
from tests.traces import make_trace


def runs(system: str, key: str, correct: list[bool]) -> list[Trace]:
    return [make_trace(f"{system}~{key}/{i}", dataset=key, reward=1.0 if ok else 0.0)
            for i, ok in enumerate(correct)]


def test_a_column_per_benchmark_their_unweighted_average_and_the_published_row() -> None:
    suite = load_suite("paper")
    traces = (runs("conductor", "gpqa-diamond", [True, True]) + runs("conductor", "aime-2025",
                                                                      [True, False, False, False])
              + runs("single a", "gpqa-diamond", [True, False])
              + runs("single a", "aime-2025", [True, True, True, True])
              + runs("single b", "gpqa-diamond", [False, False]))
    rows = {r.system: r for r in suite_rows(suite, traces)}
    conductor = rows["conductor"]
    assert conductor.accuracy == {"gpqa-diamond": 1.0, "aime-2025": 0.25}, "present columns only"
    assert conductor.average == pytest.approx(0.625), "the mean of the columns, not of the runs"
    assert conductor.tasks == 6 and conductor.tokens_per_task is not None
    assert rows["single a"].average == pytest.approx(0.75)
    assert rows["single b"].accuracy["aime-2025"] is None and rows["single b"].average is None
    assert "best single (a)" in rows
    published = rows["paper: 7B Conductor"]
    assert published.published and published.accuracy == {"gpqa-diamond": pytest.approx(0.875),
                                                           "aime-2025": None}
    assert published.average is None, "no average of a row with a figure missing"
    ordered = list(rows)
    assert ordered[0] == "conductor" and ordered[-1] == "paper: 7B Conductor"
    assert header(suite, list(rows.values())) == ("system", "GPQA-Diamond", "AIME 2025",
                                                  "average", "tokens / task", "$ / task")
    assert cells(conductor)[1:4] == ("100.0", "25.0", "62.5")
    assert cells(published)[1:] == ("87.5", "—", "—", "—", "—")


def test_the_report_files_hold_the_table_and_its_citation(tmp_path: Path) -> None:
    suite = load_suite("paper")
    rows = suite_rows(suite, runs("conductor", "livecodebench", [True, False]))
    md, js = write_suite_report("e", suite, rows, tmp_path)
    text = md.read_text()
    assert "| conductor | 50.0 | 50.0 |" in text and "| paper: 7B Conductor | 83.9 | 83.9 |" in text
    assert "arXiv:2512.04388" in text and text == markdown("e", suite, rows)
    assert '"livecodebench": 0.5' in js.read_text()


def test_a_benchmark_with_failed_runs_is_marked_and_one_with_none_completed_shows_a_dash(
) -> None:
    suite = load_suite("paper")
    broken = [t.model_copy(update={"status": "failed", "failure": "StepFailed", "reward": None})
              for t in runs("conductor", "aime-2025", [True, True])]
    traces = runs("conductor", "gpqa-diamond", [True, False]) + broken[:1] + runs(
        "conductor", "aime-2025", [True]) + [t.model_copy(update={"status": "failed",
                                                                   "reward": None})
                                             for t in runs("single a", "gpqa-diamond", [True])]
    rows = {r.system: r for r in suite_rows(suite, traces)}
    conductor, single = rows["conductor"], rows["single a"]
    assert conductor.failed == {"aime-2025": 1} and conductor.accuracy["aime-2025"] == 1.0
    assert cells(conductor)[1:4] == ("50.0", "100.0*", "75.0*")
    assert single.accuracy["gpqa-diamond"] is None and cells(single)[1] == "—"
    text = markdown("e", suite, list(rows.values()))
    assert "2 run(s) failed and are not counted as wrong" in text
