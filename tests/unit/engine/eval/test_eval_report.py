"""The eval table (engine/eval/report.py) and the batch summary count a verdict the candidate
could have forged (assert-style code tests, `"trusted": false`) apart, never as correct, and a
run that failed apart, never as a wrong answer."""

from __future__ import annotations

from conductor_engine.engine.contracts.rewards import Reward, Verdict
from conductor_engine.engine.contracts.traces import Trace
from conductor_engine.engine.eval.report import (
    BEST,
    HEADER,
    cells,
    failure_note,
    markdown,
    narrow_cells,
    narrow_header,
    system_rows,
)
from conductor_engine.engine.storage.batch_report import no_result, summarize, summary_markdown
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
    assert (row.accuracy, row.mean_reward, row.untrusted) == (None, None, 1)
    assert dict(zip(HEADER, cells(row), strict=True))["accuracy"] == "n/a"


def failed(task_id: str, system: str = "single-gpt", failure: str = "StepFailed") -> Trace:
    """A run whose step's agent could not be called (its key not set): no answer, no verdict."""
    return make_trace(f"{system}~{task_id}").model_copy(update={
        "status": "failed", "failure": failure, "answer": None, "reward": None,
        "error": "step 1 (gpt) failed: the environment variable OPENAI_API_KEY is not set"})


def test_failed_runs_are_counted_beside_accuracy_never_as_wrong_answers() -> None:
    traces = [run("a", True), run("b", False), failed("c"), failed("d", failure="PlanFailed")]
    [row, *_] = system_rows(traces)
    assert (row.tasks, row.failed, row.accuracy, row.mean_reward) == (4, 2, 0.5, 0.75)
    shown = dict(zip(HEADER, cells(row), strict=True))
    assert (shown["accuracy"], shown["failed"], shown["mean reward"]) == ("0.500*", "2", "0.750*")
    assert narrow_cells(row, True)[1:4] == ("0.500*", "2", "0.750*")
    assert narrow_header([row])[1:3] == ("accuracy", "failed")
    note = failure_note([row])
    assert note is not None and "2 run(s) failed" in note and "not counted as wrong" in note
    assert note in markdown("e1", [row])


def test_a_system_none_of_whose_runs_completed_shows_n_a_not_zero() -> None:
    rows = system_rows([run("a", True, trusted=True)] + [failed(t, "single-claude")
                                                         for t in "ab"])
    claude = next(r for r in rows if r.system == "single-claude")
    assert (claude.failed, claude.accuracy, claude.mean_reward) == (2, None, None)
    assert cells(claude)[1:3] == ("n/a", "2") and narrow_cells(claude, True)[1:3] == ("n/a", "2")
    assert claude.delta_to_best_single is None
    assert "0.000" not in "".join(cells(claude)[:5])


def test_the_best_single_agent_is_one_whose_runs_all_completed() -> None:
    """A lucky right answer among failures is not the best agent: a whole row wins."""
    rows = system_rows([make_trace(f"single gpt~{t}", reward=r) for t, r in (("a", 1.0),
                                                                               ("b", 0.5))]
                       + [failed(t, "single claude") for t in "ab"]
                       + [make_trace("single claude~c")])
    best = next(r for r in rows if r.system.startswith(BEST))
    claude = next(r for r in rows if r.system == "single claude")
    assert claude.accuracy == 1.0 and claude.failed == 2
    assert best.system == f"{BEST} (gpt)" and best.accuracy == 0.5


def test_a_cancelled_run_or_a_verifier_error_is_a_failure_an_invalid_plan_a_result() -> None:
    broken = Reward(value=0.0, reason="verifier error: boom",
                    verdict=Verdict(verifier="math", correct=False, score=0.0, reason="x"))
    invalid = make_trace("single-gpt~i").model_copy(update={
        "status": "invalid_plan", "reward": Reward(value=0.0, reason="invalid plan")})
    cancelled = make_trace("single-gpt~c").model_copy(update={"status": "cancelled"})
    errored = make_trace("single-gpt~e").model_copy(update={"reward": broken})
    assert [no_result(t) for t in (invalid, cancelled, errored)] == [
        None, "cancelled", "verifier_error"]
    [row, *_] = system_rows([invalid, cancelled, errored])
    assert (row.failed, row.accuracy) == (2, 0.0), "the invalid plan is the system's own zero"


def test_the_batch_summary_counts_failed_runs_apart_by_reason() -> None:
    s = summarize("b1", [run("a", True), run("b", False), failed("c"), failed("d")])
    assert (s["accuracy"], s["judged"], s["failed"], s["failed_by_reason"]) == \
        (0.5, 2, 2, {"step_failed": 2})
    assert s["mean_reward"] == 0.75, "failed runs have no reward to average"
    text = summary_markdown(s)
    assert "accuracy: 0.500 over 2 of 4 task(s) with a reference; 2 run(s) failed " \
           "(step failed 2): no result, not counted as wrong" in text
    none = summarize("b2", [failed("a")])
    assert none["accuracy"] is None and "accuracy: —" in summary_markdown(none)


def test_the_batch_summary_counts_untrusted_verdicts_apart() -> None:
    traces = [run("a", True, trusted=True), run("b", True, trusted=False)]
    s = summarize("b1", traces)
    assert (s["accuracy"], s["untrusted"], s["with_reference"], s["mean_reward"]) == \
        (1.0, 1, 2, 1.0)
    assert "1 whose verdict is untrusted" in summary_markdown(s)
