"""The third review's replies that stalled the verifiers, escaped their score or won twice,
as a policy under RL would write them. Each scores wrong (reward `wrong`, in its group), in
time, and never as a verifier error, which would take the rollout out of its group. Real
helper processes and real sandboxed runs through `verify` and `score_run`."""

from __future__ import annotations

import json
import time

import pytest

from conductor_engine.engine.contracts.rewards import RewardWeights
from conductor_engine.engine.rewards import score_run, verify

WRONG = RewardWeights().wrong


def test_a_math_answer_that_makes_math_verify_give_up_scores_wrong() -> None:
    started = time.monotonic()
    reward = score_run("completed", "So the answer is $\\boxed{10^{10^{10}}}$.", "5", "math")
    assert time.monotonic() - started < 30
    assert reward.verdict is not None and "error" not in reward.verdict.details, reward.reason
    assert reward.value == WRONG and "gave up" in reward.reason


@pytest.mark.parametrize("reply", [
    "The answer is a" + " " * 60_000 + "b",
    "Answer: a" + " " * 60_000 + "b",
    "answer" + " " * 60_000 + "is b",
])
@pytest.mark.parametrize(("reference", "verifier"), [("x", "exact"), ("A", "choice")])
def test_long_blank_runs_in_an_answer_line_are_judged_at_once(reply: str, reference: str,
                                                              verifier: str) -> None:
    started = time.thread_time()
    v = verify(reply, reference, verifier)
    assert time.thread_time() - started < 1.0
    assert v.correct is False and "error" not in v.details, v.reason


def test_a_program_printing_a_long_number_like_token_is_judged_at_once() -> None:
    program = "```python\nprint('0' * 250000 + 'x')\n```"
    reference = json.dumps({"io": [{"input": "", "output": "0"}]})
    started = time.monotonic()
    v = verify(program, reference, "code")
    assert time.monotonic() - started < 30  # the sandbox's start-up; the comparison is instant
    assert v.correct is False and "error" not in v.details, v.reason
    assert "expected '0'" in v.reason


@pytest.mark.parametrize("reference", ["yes", "no"])
def test_a_boxed_answer_and_a_different_answer_line_win_nothing(reference: str) -> None:
    reward = score_run("completed", "\\boxed{no}\n\nAnswer: yes", reference, "exact")
    assert reward.value == WRONG and "hedged" in reward.reason


@pytest.mark.parametrize(("reply", "verifier", "reference"), [
    ("```python\n" + "#" * (2 << 20) + "\n```", "code", "assert f() == 1"),
    ("\\boxed{" + "1" * 200_000 + "}", "math", "5"),
    ("```python\ndef f():\n    return 1\x00\n```", "code", "assert f() == 1"),
    ("```python\nprint(1)\x00\n```", "code", json.dumps({"io": [{"input": "", "output": "1"}]})),
])
def test_oversized_or_malformed_answers_score_wrong_not_a_verifier_error(
        reply: str, verifier: str, reference: str) -> None:
    v = verify(reply, reference, verifier)
    assert v.correct is False and "error" not in v.details, v.reason
