"""Verifiers and the reward scheme. No Temporal needed. The code verifier has its own tests
(tests/unit/engine/rewards/test_code_verifier.py) and attack suite (tests/security/)."""

from __future__ import annotations

import asyncio
import threading
import time
from decimal import Decimal

import pytest

from conductor_engine.engine.contracts.rewards import RewardWeights, Verdict
from conductor_engine.engine.rewards import VERIFIERS, detect_verifier, score_run, verifiers, verify

ADD_TESTS = """
def test_small():
    assert add(1, 2) == 3

def test_negative():
    assert add(-1, -1) == -2
"""


def fenced(code: str) -> str:
    return f"Here is my solution.\n\n```python\n{code}\n```\n\nIt works."


# --- exact --------------------------------------------------------------------------------


@pytest.mark.parametrize("answer", [
    "Paris", "paris.", "  PARIS ", '"Paris"',
    "The capital of France is a city on the Seine.\nAnswer: Paris",
    "Let me think... so it must be $\\boxed{\\text{Paris}}$.",
    "**Final answer:** Paris",
])
def test_exact_accepts_the_reference_in_the_forms_models_write(answer: str) -> None:
    v = verify(answer, "Paris", "exact")
    assert (v.verifier, v.correct, v.score) == ("exact", True, 1.0), v.reason


def test_exact_ignores_articles_and_punctuation_like_squad() -> None:
    assert verify("the Eiffel Tower!", "Eiffel Tower", "exact").correct


def test_exact_says_what_it_expected_when_wrong() -> None:
    v = verify("Answer: London", "Paris", "exact")
    assert (v.correct, v.score) == (False, 0.0)
    assert "expected 'Paris'" in v.reason and "London" in v.reason


# --- choice -------------------------------------------------------------------------------


@pytest.mark.parametrize(("answer", "letter"), [
    ("The answer is (C).", "C"),
    ("C.", "C"),
    ("**C**", "C"),
    ("Answer: c", "C"),
    ("C) 42, because the others are too small", "C"),
    ("Thus $\\boxed{C}$", "C"),
    ("Between B and D, I'd go with D", "D"),
    ("Options (A) and (B) look plausible; the answer is D", "D"),
    ("Answer: B. Note that (C) is tempting but wrong.", "B"),
    ("Option B is correct, not A.", "B"),
])
def test_choice_reads_the_letter_preferring_explicit_forms(answer: str, letter: str) -> None:
    v = verify(answer, letter, "choice")
    assert v.correct, (v.reason, v.details)
    assert v.details["chosen"] == letter


def test_choice_reports_the_wrong_letter() -> None:
    v = verify("I am fairly sure the answer is (A).", "(C)", "choice")
    assert (v.correct, v.reason) == (False, "expected C, got A")


def test_choice_with_no_letter_is_wrong_not_an_error() -> None:
    v = verify("I don't know.", "B", "choice")
    assert v.correct is False and "error" not in v.details


# --- math ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("answer", "reference"), [
    ("So the result is $\\boxed{\\frac{1}{2}}$", "0.5"),
    ("The answer is 1,000.", "1000"),
    ("Final: $1+x^2$", "x^2+1"),
    ("**Answer:** 3/4", "\\frac{3}{4}"),
    ("$2^{10}$", "1024"),
])
def test_math_accepts_equivalent_forms(answer: str, reference: str) -> None:
    v = verify(answer, reference, "math")
    assert (v.verifier, v.correct) == ("math", True), v.reason


def test_math_says_what_it_expected_when_wrong() -> None:
    v = verify("The answer is 41.", "42", "math")
    assert (v.correct, v.reason) == (False, "expected 42, got 41")


def test_math_with_an_unparsable_reference_is_a_verifier_error() -> None:
    v = verify("5", "\\frac{", "math")
    assert v.correct is False and v.reason.startswith("verifier error:")
    assert "cannot parse the reference" in v.reason


@pytest.mark.parametrize("answer", [
    "$x = 5$", "5\\%", "$\\sqrt{25}$", "$5.0$", "$\\log_2 32$", "$2.5 \\cdot 2$", "$\\frac{10}{2}$",
])
def test_an_integer_reference_takes_exact_forms_of_that_integer(answer: str) -> None:
    assert verify(answer, "5", "math").correct


def _scientific(n: int) -> tuple[str, int]:
    """`n` as a float writes it (16 significant digits), in LaTeX, and its exact value."""
    mantissa, exponent = f"{float(n):.15e}".split("e")
    value = int(Decimal(mantissa) * 10 ** int(exponent))
    return f"${mantissa} \\times 10^{{{int(exponent)}}}$", value


def test_an_integer_reference_takes_only_that_integer_near_2_53_and_2_63() -> None:
    """math-verify compares a number written with a point at float precision: without the
    guard `1.0 \\times 10^{18}` equals 10^18+1. Every wrong neighbour must fail, in every form."""
    for base in (2**53, 2**63, 10**18):
        for n in (base + k for k in range(-3, 4)):
            for m in (n - 1, n, n + 1):
                assert verify(str(m), str(n), "math").correct is (m == n), (n, m)
                assert verify(f"${m}.0$", str(n), "math").correct is (m == n), (n, m)
            written, value = _scientific(n)
            assert verify(written, str(n), "math").correct is (value == n), (n, written)
    assert not verify("$1.0 \\times 10^{18}$", str(10**18 + 1), "math").correct
    assert not verify("1.1826458e17", "118264581564861424", "math").correct


def test_a_float_reference_keeps_its_tolerance() -> None:
    assert verify("2.5000001", "2.5", "math").correct and verify("5/2", "2.5", "math").correct
    assert not verify("2.6", "2.5", "math").correct


def test_math_gives_up_on_a_runaway_comparison_in_time_and_scores_it_wrong() -> None:
    """The candidate's text made math-verify give up: that is the answer's failure, a wrong
    answer, never a verifier error (which would drop the rollout from its group)."""
    started = time.monotonic()
    v = verify("$10^{10^{10}}$", "$10^{10^{9}}$", "math", timeout_s=3)
    assert time.monotonic() - started < 20, "given up (the comparison itself would never end)"
    assert v.correct is False and "error" not in v.details, v.reason
    assert "timed out" in v.reason


def test_verify_works_off_the_main_thread() -> None:
    """The score activity calls verifiers via asyncio.to_thread; math-verify's signal-based
    timeouts would fail there if it ran in that thread."""
    results: dict[str, Verdict] = {}

    def work() -> None:
        results["math"] = verify("\\boxed{\\frac{2}{4}}", "0.5")
        results["code"] = verify(fenced("def f():\n    return 1"), "assert f() == 1", "code")

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(60)
    assert results["math"].correct, results["math"].reason
    assert results["code"].correct, results["code"].reason
    in_loop = asyncio.run(asyncio.to_thread(verify, "x = 3", "3", "math"))
    assert in_loop.correct


# --- auto ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("reference", "expected"), [
    ("B", "choice"), ("(b)", "choice"), ("D.", "choice"),
    ("42", "math"), ("-3.5", "math"), ("1,000", "math"), ("50%", "math"), ("2/3", "math"),
    ("\\frac{1}{2}", "math"), ("x^2+1", "math"), ("(1, 2)", "math"), ("$\\pi$", "math"),
    ("Paris", "exact"), ("10 cm", "exact"), ("2024-01-05", "exact"), ("yes", "exact"),
    ("assert add(1, 2) == 3", "code"), ("def test_add():\n    assert add(1, 2) == 3", "code"),
])
def test_auto_picks_the_verifier_from_the_reference(reference: str, expected: str) -> None:
    assert detect_verifier(reference) == expected


def test_auto_verifies_with_the_detected_verifier() -> None:
    assert verify("the answer is (B)", "B").verifier == "choice"
    v = verify("\\boxed{0.5}", "\\frac{1}{2}")
    assert (v.verifier, v.correct, v.details["auto"]) == ("math", True, True)
    assert verify("Answer: Paris", "Paris").verifier == "exact"


def test_auto_falls_back_to_exact_when_math_verify_cannot_read_the_reference() -> None:
    v = verify("\\frac{", "\\frac{")
    assert (v.verifier, v.correct) == ("exact", True), v.reason
    assert "fallback" in v.details


# --- verifier errors are verdicts, never exceptions ----------------------------------------


def test_unknown_verifier_is_an_error_listing_the_valid_names() -> None:
    v = verify("42", "42", "regex")
    assert v.correct is False and v.reason.startswith("verifier error: unknown verifier")
    assert all(name in v.reason for name in VERIFIERS)
    reward = score_run("completed", "42", "42", "regex")
    assert reward.value == 0.0 and "unknown verifier" in reward.reason


def test_malformed_choice_reference_is_an_error() -> None:
    v = verify("A", "Paris and London", "choice")
    assert v.correct is False and v.details["error"]


def test_a_crashing_verifier_is_reward_zero_with_its_reason(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(answer: str, reference: str, timeout_s: float) -> Verdict:
        raise RuntimeError("disk on fire")

    monkeypatch.setitem(verifiers._CHECKS, "exact", boom)
    v = verify("Paris", "Paris", "exact")
    assert (v.correct, v.score) == (False, 0.0) and "disk on fire" in v.reason
    reward = score_run("completed", "Paris", "Paris", "exact")
    assert reward.value == 0.0 and "disk on fire" in reward.reason


# --- the reward scheme --------------------------------------------------------------------


@pytest.mark.parametrize(("status", "answer", "expected"), [
    ("invalid_plan", None, 0.0),
    ("failed", None, 0.0),
    ("cancelled", None, 0.0),
    ("completed", "The answer is 41", 0.5),
    ("completed", None, 0.5),
    ("completed", "The answer is 42", 1.0),
])
def test_the_papers_scheme_is_the_default(status: str, answer: str | None,
                                          expected: float) -> None:
    reward = score_run(status, answer, "42", None)
    assert reward.value == expected, reward.reason
    assert reward.weights == RewardWeights()


def test_weights_are_configurable() -> None:
    w = RewardWeights(invalid_plan=-1.0, failed=-0.5, wrong=0.0, correct=2.0)
    assert score_run("invalid_plan", None, "42", None, weights=w).value == -1.0
    assert score_run("failed", None, "42", None, weights=w).value == -0.5
    assert score_run("completed", "41", "42", None, weights=w).value == 0.0
    assert score_run("completed", "42", "42", None, weights=w).value == 2.0


def test_cost_penalty_lowers_a_reward_but_not_below_zero() -> None:
    w = RewardWeights(cost_penalty_per_usd=2.0)
    correct = score_run("completed", "42", "42", None, cost_usd=0.1, weights=w)
    assert correct.value == pytest.approx(0.8) and "cost penalty" in correct.reason
    assert score_run("completed", "42", "42", None, cost_usd=5.0, weights=w).value == 0.0
    assert score_run("invalid_plan", None, "42", None, cost_usd=5.0, weights=w).value == 0.0
    assert score_run("completed", "42", "42", None, cost_usd=5.0).value == 1.0


def test_partial_code_credit_lies_between_wrong_and_correct() -> None:
    answer = fenced("def add(a, b):\n    return abs(a + b)")
    assert score_run("completed", answer, ADD_TESTS, "code").value == pytest.approx(0.75)


def test_no_reference_means_no_reward() -> None:
    for status in ("completed", "invalid_plan", "failed"):
        reward = score_run(status, "42", None, None)
        assert (reward.value, reward.reason) == (None, "no reference answer")
    assert verify("42", None).correct is None


def test_unknown_status_is_not_scored() -> None:
    reward = score_run("running", "42", "42", None)
    assert reward.value is None and "unknown run status" in reward.reason


def test_rewards_round_trip_through_json() -> None:
    reward = score_run("completed", fenced("def add(a, b):\n    return a + b"), ADD_TESTS, None)
    assert type(reward).model_validate_json(reward.model_dump_json()) == reward



def _math_helpers() -> list[int]:
    """This process's math helpers."""
    import os
    from pathlib import Path

    found = []
    for entry in Path("/proc").iterdir():
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if parent == os.getpid() and b"_math_worker.py" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_an_idle_math_helper_that_died_is_replaced_not_a_verifier_error() -> None:
    """A helper killed while it sat idle (by the host, or a test) has read nothing: the next
    check takes a fresh helper and judges the answer, rather than failing on a broken pipe."""
    import os
    import signal

    assert verify("1", "1", "math").correct  # a helper is started and left idle
    for pid in _math_helpers():
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)  # the kernel has delivered the kills (the pool does not reap them itself)
    assert verify("The sum is 11/12.", "\\frac{11}{12}", "math").correct


def test_a_math_helper_killed_from_outside_is_a_verifier_error() -> None:
    """Only our machinery failing is a verifier error: the helper killed by something else
    (the host's OOM killer) while it read the answer is one; its own timeout is not."""
    import os
    import signal

    helpers = _math_helpers
    verify("1", "1", "math")  # a helper is started and idle
    result: dict[str, Verdict] = {}
    thread = threading.Thread(target=lambda: result.update(
        v=verify("$\\boxed{10^{10^{10}}}$", "5", "math", timeout_s=20)))
    thread.start()
    time.sleep(2)  # the helper is inside math-verify on the answer (it gives up after 6 s)
    for pid in helpers():
        os.kill(pid, signal.SIGKILL)
    thread.join(60)
    v = result["v"]
    assert v.correct is False and v.reason.startswith("verifier error:"), v.reason
