"""The eval table (engine/eval/report.py) and the batch summary count a verdict the candidate
could have forged (assert-style code tests, `"trusted": false`) apart, never as correct."""

from __future__ import annotations

from conductor_engine.engine.contracts.rewards import Reward, Verdict
from conductor_engine.engine.contracts.traces import Trace
from conductor_engine.engine.eval.report import HEADER, cells, markdown, narrow_cells, system_rows
from conductor_engine.engine.storage.batch_report import summarize, summary_markdown
from tests.traces import make_trace


def run(task_id: str, correct: bool, *, trusted: bool | None = None) -> Trace:
    """A finished run of the `single gpt` system with a code verdict."""
    details = {} if trusted is None else {"trusted": trusted}
    verdict = Verdict(verifier="code", correct=correct, score=float(correct),
                      reason="1/1 tests passed" if correct else "0/1", details=details)
    reward = Reward(value=1.0 if correct else 0.5, verdict=verdict, reason="")
    return make_trace(f"single-gpt~{task_id}").model_copy(update={"reward": reward})


def test_untrusted_verdicts_are_counted_apart_from_accuracy() -> None:
    traces = [run("a", True, trusted=True), run("b", False, trusted=True),
              run("c", True), run("d", True, trusted=False), run("e", True, trusted=False)]
    [row, *_] = system_rows(traces)
    assert (row.tasks, row.untrusted) == (5, 2)
    assert row.accuracy == 2 / 3, "two right of the three trusted, the forgeable ones aside"
    assert row.mean_reward == (1.0 + 0.5 + 1.0) / 3
    shown = dict(zip(HEADER, cells(row), strict=True))
    assert (shown["accuracy"], shown["untrusted"]) == ("0.667", "2")
    assert "0.667 (2 untrusted)" in narrow_cells(row)
    assert "| untrusted |" in markdown("e1", [row])


def test_a_system_with_only_untrusted_verdicts_has_no_accuracy_to_show() -> None:
    [row, *_] = system_rows([run("a", True, trusted=False)])
    assert (row.accuracy, row.mean_reward, row.untrusted) == (0.0, 0.0, 1)


def test_the_batch_summary_counts_untrusted_verdicts_apart() -> None:
    traces = [run("a", True, trusted=True), run("b", True, trusted=False)]
    s = summarize("b1", traces)
    assert (s["accuracy"], s["untrusted"], s["with_reference"], s["mean_reward"]) == \
        (1.0, 1, 2, 1.0)
    assert "less 1 whose verdict is untrusted" in summary_markdown(s)
