"""The second review's wrong answers that the verifier graded right (issue 32, findings 1 and 6),
as the candidate answers a policy would give: each must score 0, and a verdict the candidate
could forge must never count as correct in an eval or batch report. Real sandboxed runs through
`verify` and `score_run`, real report code."""

from __future__ import annotations

import json

import pytest

from conductor_engine.engine.eval.report import system_row
from conductor_engine.engine.rewards import score_run, verify
from conductor_engine.engine.storage.batch_report import summarize
from tests.traces import make_trace


def fenced(code: str) -> str:
    return f"My solution:\n\n```python\n{code}\n```\n"


def io(expected: str) -> str:
    return json.dumps({"io": [{"input": "", "output": expected}]})


# --- finding 1: wrong integers and loose types, in the trusted forms ------------------------

WRONG_ANSWERS: dict[str, tuple[str, str]] = {
    # name: (reference, the candidate's code)
    "1000000000 printed for 1000000007": (io("1000000007"), "print(1000000000)"),
    "1e9 printed for 1000000007": (io("1000000007"), "print('1e9')"),
    "1000000007.0 printed for 1000000007": (io("1000000007"), "print(1000000007.0)"),
    "10**18 printed for 10**18+1": (io(str(10**18 + 1)), "print(10**18)"),
    "2**53 printed for 2**53+1": (io(str(2**53 + 1)), "print(float(2**53 + 1))"),
    "underscores and Arabic-Indic digits": (io("1000000 123"), "print('1_000_000 ١٢٣')"),
    "a no-break space for a separator": (io("1 2"), "print('1\\u00a02')"),
    "inf printed for a huge float": (io("1e308"), "print('inf')"),
    "a float for an MBPP integer": ("assert f() == 118264581564861424",
                                    "def f():\n    return 1.1826458e17"),
    "the float nearest an MBPP integer": ("assert f() == 118264581564861425",
                                          "def f():\n    return float(118264581564861425)"),
    "int keys for str keys (JSON cases)": (
        json.dumps({"function": "f", "cases": [{"args": [], "expected": {"1": 2}}]}),
        "def f():\n    return {1: 2}"),
    "int keys for str keys (MBPP)": ("assert f() == {'1': 2}", "def f():\n    return {1: 2}"),
    "str keys for int keys (MBPP)": ("assert f() == {1: 2}", "def f():\n    return {'1': 2}"),
    "True for 1": ("assert f() == 1", "def f():\n    return True"),
    "a list for a tuple (MBPP)": ("assert f() == (1, 2)", "def f():\n    return [1, 2]"),
    "an int that equals anything": ("assert f() == 912837", """
class Anything(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
def f():
    return Anything(1)
"""),
    "a forged encoding of the return value": ("assert f() == {'1': 2}", """
def conductor_typed_value(value):
    return ["dict", [["1", 2]]]
def f():
    return {1: 2}
"""),
}


@pytest.mark.parametrize("name", list(WRONG_ANSWERS))
def test_a_wrong_integer_or_type_in_a_trusted_form_scores_zero(name: str) -> None:
    reference, code = WRONG_ANSWERS[name]
    v = verify(fenced(code), reference, "code")
    assert (v.correct, v.score) == (False, 0.0), f"{name}: {v.reason}"
    assert "error" not in v.details, f"{name} is a wrong answer, not a verifier error"
    assert v.details["trusted"] is True


def test_the_forged_encoding_gains_nothing_over_returning_the_value() -> None:
    """The encoder runs in the candidate's process and can be replaced; its output is only
    ever a value the candidate could have returned. A right value still passes."""
    reference, _ = WRONG_ANSWERS["a forged encoding of the return value"]
    assert verify(fenced("def f():\n    return {'1': 2}"), reference, "code").correct


@pytest.mark.parametrize(("reference", "answer"), [
    (str(10**18 + 1), "$1.0 \\times 10^{18}$"),
    ("1000000007", "1000000000"),
    ("1000000007", "1e9"),
    ("118264581564861424", "1.1826458e17"),
    ("1000000", "1_000_000"),
    ("123", "١٢٣"),
])
def test_a_wrong_integer_math_answer_scores_zero(reference: str, answer: str) -> None:
    v = verify(answer, reference, "math")
    assert v.correct is False and "error" not in v.details, v.reason


def test_near_2_53_and_2_63_every_wrong_integer_fails_through_the_sandbox() -> None:
    """One sandboxed run per form: each case expects n and the candidate returns (or prints)
    a neighbour; then the right values, which must all pass."""
    near = [b + k for b in (2**53, 2**63, -(2**63)) for k in (-2, -1, 0, 1, 2)]
    calls = json.dumps({"function": "f", "cases": [{"args": [n], "expected": n} for n in near]})
    ios = json.dumps({"io": [{"input": str(n), "output": str(n)} for n in near]})
    for shift in ("x + 1", "x - 1", "float(x)", "x + 1.0"):
        v = verify(fenced(f"def f(x):\n    return {shift}"), calls, "code")
        # a float whose value is exactly n passes (2.0**63 for 2**63), as Python's == says
        exact = sum(eval(shift, {"x": n}) == n for n in near)
        assert exact < len(near) // 2 and v.score == exact / len(near), (shift, v.reason)
        p = verify(fenced(f"x = int(input())\nprint({shift})"), ios, "code")
        assert p.score == 0.0, (shift, p.reason)
    assert verify(fenced("def f(x):\n    return x"), calls, "code").correct
    assert verify(fenced("print(int(input()))"), ios, "code").correct


# --- finding 6: a forged assert-style pass never counts as correct --------------------------

SECRET_TESTS = """
def test_secret():
    assert isinstance(solve(), list)
    assert len(solve()) == 7
    assert abs(solve()[0]) == 912837
"""
FORGERIES = {
    "abs, len and isinstance redefined": """
class Anything:
    def __eq__(self, other):
        return True
def abs(x):
    return Anything()
def len(x):
    return Anything()
def isinstance(x, t):
    return True
def solve():
    return [0]
""",
    "the runner's _run_one redefined": """
import __main__
__main__._run_one = lambda test: None
def solve():
    return [0]
""",
}


@pytest.mark.parametrize("name", list(FORGERIES))
def test_a_forged_assert_pass_is_untrusted_and_not_counted_in_eval(name: str) -> None:
    answer = fenced(FORGERIES[name])
    v = verify(answer, SECRET_TESTS, "code")
    assert v.details["trusted"] is False and v.untrusted, v.reason
    reward = score_run("completed", answer, SECRET_TESTS, "code")
    forged = make_trace("forged").model_copy(update={"reward": reward})
    honest = make_trace("honest", reward=0.5)  # a trusted, wrong verdict
    row = system_row("single gpt", [forged, honest])
    assert (row.accuracy, row.untrusted, row.mean_reward) == (0.0, 1, 0.5), row
    summary = summarize("b", [forged, honest])
    assert (summary["accuracy"], summary["untrusted"]) == (0.0, 1)
