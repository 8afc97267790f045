"""The code verifier: the reference forms (stdin/stdout, function calls, asserts), the trusted
comparison, the limits, and the sandbox's probe. Real sandboxed runs, no mocks; the hostile
cases are in tests/security/."""

from __future__ import annotations

import json
import os
import time

import pytest

from conductor_engine.engine.rewards import sandbox as sb
from conductor_engine.engine.rewards import score_run, verify
from conductor_engine.engine.rewards.code_tests import parse_reference, same_output, same_value
from conductor_engine.engine.rewards.sandbox import SandboxLimits, run_python_tests
from conductor_engine.engine.rewards.sandbox.run import _Assembler


def fenced(code: str) -> str:
    return f"Here is my solution.\n\n```python\n{code}\n```\n\nIt works."


ADD_TESTS = """
def test_small():
    assert add(1, 2) == 3

def test_negative():
    assert add(-1, -1) == -2
"""
SUM_IO = json.dumps({"io": [{"input": "1 2\n", "output": "3\n"},
                            {"input": "-5 5\n", "output": "0"}]})
SUM_PROGRAM = "import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)\n"
TWO_SUM = json.dumps({"function": "Solution.twoSum", "cases": [
    {"args": [[2, 7, 11, 15], 9], "expected": [0, 1]},
    {"args": [[3, 2, 4], 6], "expected": [1, 2]},
]})


# --- forms --------------------------------------------------------------------------------


def test_stdin_stdout_cases_are_compared_by_the_parent() -> None:
    v = verify(fenced(SUM_PROGRAM), SUM_IO, "code")
    assert (v.correct, v.score, v.reason) == (True, 1.0, "2/2 cases passed")
    assert v.details["form"] == "io" and v.details["trusted"] is True
    wrong = verify(fenced(SUM_PROGRAM.replace("a + b", "a * b")), SUM_IO, "code")
    assert (wrong.correct, wrong.score) == (False, 0.0)
    assert "expected '3', got '2'" in wrong.reason


def test_livecodebench_stdin_lists_are_io_cases() -> None:
    ref = json.dumps([{"input": "2 2", "output": "4", "testtype": "stdin"}])
    assert parse_reference(ref).form == "io"
    assert verify(fenced(SUM_PROGRAM), ref, "code").correct


def test_function_call_cases_call_methods_of_a_fresh_instance() -> None:
    solution = ("class Solution:\n    def twoSum(self, nums, target):\n"
                "        seen = {}\n        for i, n in enumerate(nums):\n"
                "            if target - n in seen:\n                return [seen[target - n], i]\n"
                "            seen[n] = i\n")
    v = verify(fenced(solution), TWO_SUM, "code")
    assert (v.correct, v.reason) == (True, "2/2 cases passed"), v.reason


def test_literal_asserts_become_trusted_call_cases() -> None:
    tests = parse_reference("from solution import sq\nassert sq(3) == 9\nassert sq(-2) == 4\n")
    assert tests.form == "call" and tests.trusted and len(tests.calls) == 2
    assert verify("def sq(x):\n    return x * x", "assert sq(3) == 9", "code").correct
    v = verify("def sq(x):\n    return x + x", "assert sq(3) == 9", "code")
    assert (v.correct, v.score) == (False, 0.0) and "expected 9, got 6" in v.reason


def test_other_test_code_runs_as_asserts_and_says_it_is_untrusted() -> None:
    v = verify(fenced("def add(a, b):\n    return a + b"), ADD_TESTS, "code")
    assert (v.correct, v.score) == (True, 1.0)
    assert v.details["trusted"] is False and "forge" in v.details["limits"]
    assert v.reason == "2/2 tests passed [untrusted: assert-style tests]"
    half = verify(fenced("def add(a, b):\n    return abs(a + b)"), ADD_TESTS, "code")
    assert half.score == 0.5 and "test_negative" in half.reason


def test_the_trusted_comparison_is_strict_about_types_and_lenient_about_whitespace() -> None:
    assert not same_value(1, True) and not same_value([1], [1, 2])
    assert same_value(0.1 + 0.2, 0.3) and same_value({"a": [1]}, {"a": [1]})
    assert not same_value("1", 1)
    assert same_output("1 2\n3\n", "1 2   \n3\n\n") and same_output("0.5", "0.50000001")
    assert not same_output("1 2", "1 3")


def test_a_malformed_json_reference_is_a_verifier_error() -> None:
    for reference in ('{"function": "f"}', '{"io": []}', "[]"):
        v = verify("def f(): pass", reference, "code")
        assert v.correct is False and v.details["error"].startswith("malformed code cases")
    assert verify("[]", "[]").details.get("form") is None  # an empty list is not code


def test_auto_detects_json_cases_as_code() -> None:
    assert verify(fenced(SUM_PROGRAM), SUM_IO).details["form"] == "io"


def test_code_that_does_not_import_is_wrong_not_an_error() -> None:
    v = verify(fenced("def broken(:\n    pass"), TWO_SUM, "code")
    assert (v.correct, v.score) == (False, 0.0)
    assert "SyntaxError" in v.reason and "error" not in v.details


def test_each_case_runs_and_a_crash_in_one_fails_only_that_one() -> None:
    ref = json.dumps({"function": "inv", "cases": [{"args": [2], "expected": 0.5},
                                                  {"args": [0], "expected": 0}]})
    v = verify("def inv(x):\n    return 1 / x", ref, "code")
    assert v.score == 0.5 and "ZeroDivisionError" in v.reason


# --- limits -------------------------------------------------------------------------------


def test_an_endless_loop_times_out_keeping_the_cases_that_finished() -> None:
    ref = json.dumps({"function": "f", "cases": [{"args": [1], "expected": 1},
                                                {"args": [0], "expected": 0}]})
    started = time.monotonic()
    v = verify("def f(x):\n    while not x:\n        pass\n    return x", ref, "code",
               timeout_s=6)
    assert time.monotonic() - started < 30  # a safety net, not the check
    assert (v.correct, v.score) == (False, 0.5) and v.details["timed_out"]


def test_an_io_case_that_hangs_fails_alone() -> None:
    ref = json.dumps({"io": [{"input": "1", "output": "1"}, {"input": "0", "output": "0"}]})
    program = "x = input()\nwhile x == '0':\n    pass\nprint(x)\n"
    res = sb.run_io_cases(program, ["1", "0"], SandboxLimits(timeout_s=60, case_timeout_s=5))
    assert res.io[0] is not None and res.io[0].stdout == "1\n"
    assert res.io[1] is not None and res.io[1].timed_out
    assert verify(fenced(program), ref, "code", timeout_s=8).score == 0.5


def test_memory_is_limited() -> None:
    ref = json.dumps({"function": "hog", "cases": [{"args": [], "expected": 0}]})
    v = verify("def hog():\n    return len(bytearray(2 * 1024**3))", ref, "code")
    assert v.correct is False and "MemoryError" in v.reason


def test_the_candidate_sees_no_inherited_environment() -> None:
    """conftest sets TEST_*_KEY variables, as a worker would hold real API keys."""
    assert os.environ.get("TEST_OPENAI_KEY")
    res = run_python_tests("", "import os\nassert not [k for k in os.environ if 'KEY' in k]")
    assert res.passed == 1, res


# --- strict events ------------------------------------------------------------------------


def test_out_of_order_or_repeated_case_events_break_the_protocol() -> None:
    from conductor_engine.engine.rewards.sandbox.models import CallEvent

    asm = _Assembler({"mode": "call", "cases": [{}, {}]})
    assert asm.add(CallEvent(event="call", index=1, value="1", error=None))
    asm = _Assembler({"mode": "call", "cases": [{}]})
    assert asm.add(CallEvent(event="call", index=0, value="1", error=None)) == ""
    assert asm.add(CallEvent(event="call", index=0, value="1", error=None))


# --- the probe: fail closed, retried -------------------------------------------------------


def test_the_probe_finds_a_backend_here_and_reports_it_in_the_verdict() -> None:
    iso = sb.isolation()
    assert iso.backend in ("bwrap", "namespaces"), iso.problems
    v = verify("def f():\n    return 1", "assert f() == 1", "code")
    assert v.details["isolation"]["backend"] == iso.backend


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a root worker never uses bubblewrap")
def test_with_no_sandbox_the_verifier_refuses_and_the_probe_is_retried() -> None:
    try:
        sb.configure(sb.SandboxConfig(backend="bwrap"))  # never works for root: no sandbox
        v = verify("def f():\n    return 1", "assert f() == 1", "code")
        assert v.correct is False and v.reason.startswith("verifier error: no code sandbox")
        assert "code_sandbox" in v.reason
        reward = score_run("completed", "def f():\n    return 1", "assert f() == 1", "code")
        assert reward.value == 0.0 and "no code sandbox" in reward.reason
        assert sb.host.STATE.found is None  # a failed probe is not kept
    finally:
        sb.configure(sb.SandboxConfig())
    assert verify("def f():\n    return 1", "assert f() == 1", "code").correct


# --- the run's edges: what the candidate or the host's load can cause ----------------------


def test_a_sandbox_that_never_became_ready_is_a_verifier_error_not_a_crash() -> None:
    """Nothing of the candidate's runs before "ready": a run that timed out or broke before it
    (an overloaded host) is our failure, reported as one, for every form."""
    from conductor_engine.engine.rewards.sandbox.run import _assemble

    limits = SandboxLimits(timeout_s=2)
    for mode in ("io", "call", "asserts"):
        job = {"mode": mode, "inputs": ["1\n"], "cases": [{}]}
        res = _assemble(job, [], "", b"", -9, True, limits)
        assert res.error is not None and "did not start within 2s" in res.error, mode
        res = _assemble(job, [], "malformed sandbox output (x: y)", b"", 1, False, limits)
        assert res.error is not None and "malformed" in res.error, mode


def test_case_results_cut_short_are_cases_not_run() -> None:
    """Fewer results than cases (a run that stopped early) fail the missing cases; they never
    make the comparison raise."""
    from conductor_engine.engine.rewards.sandbox.models import SandboxResult
    from conductor_engine.engine.rewards.verifiers import _case_outcomes

    tests = parse_reference(SUM_IO)
    short = SandboxResult(failure="killed by signal SIGKILL")
    assert _case_outcomes(tests, short) == [(False, "killed by signal SIGKILL")] * 2
    tests = parse_reference(TWO_SUM)
    assert _case_outcomes(tests, SandboxResult(timed_out=True)) == [(False, "timed out")] * 2


def test_the_descendant_walk_survives_processes_that_come_and_go() -> None:
    """The runner's kill walks /proc while the candidate's processes exit and are reaped: one
    that vanishes mid-walk is skipped, never an error that would fail the run."""
    import subprocess
    import sys

    from conductor_engine.engine.rewards.sandbox.run import _descendants

    churn = ("import os\nwhile True:\n    pid = os.fork()\n    if pid == 0:\n"
             "        os._exit(0)\n    os.waitpid(pid, 0)\n")
    proc = subprocess.Popen([sys.executable, "-c", churn])
    try:
        for _ in range(3000):
            assert proc.pid not in _descendants(proc.pid)
        assert _descendants(2**22 + 12345) == []  # no such process
    finally:
        proc.kill()
        proc.wait()
