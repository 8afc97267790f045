"""Verifiers and the reward scheme. No Temporal needed; the code verifier's sandbox tests run real
hostile code (network, fork bomb, endless loop, memory hog) under tight limits."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conductor_engine.engine.rewards import (
    VERIFIERS,
    RewardWeights,
    Verdict,
    detect_verifier,
    sandbox,
    score_run,
    verifiers,
    verify,
)
from conductor_engine.engine.rewards.sandbox import SandboxLimits, run_python_tests

NAMESPACES = sandbox._host().namespaces
needs_namespaces = pytest.mark.skipif(not NAMESPACES, reason="unshare does not work here")
RUNNER_NAME = sandbox.RUNNER.name


def fenced(code: str) -> str:
    return f"Here is my solution.\n\n```python\n{code}\n```\n\nIt works."


def sandbox_processes() -> list[str]:
    """Command lines of live sandbox runners (to prove a run left nothing behind)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if RUNNER_NAME in text:
            found.append(text)
    return found


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A local TCP server the candidate must not reach."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.settimeout(0.2)
    yield srv
    srv.close()


def nobody_connected(srv: socket.socket) -> bool:
    try:
        conn, _ = srv.accept()
    except TimeoutError:
        return True
    conn.close()
    return False


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


def test_math_gives_up_on_a_runaway_comparison_in_time() -> None:
    started = time.monotonic()
    v = verify("$10^{10^{10}}$", "$10^{10^{9}}$", "math", timeout_s=3)
    assert time.monotonic() - started < 5
    assert v.correct is False and v.reason.startswith("verifier error:")


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


# --- code ---------------------------------------------------------------------------------

ADD_TESTS = """
def test_small():
    assert add(1, 2) == 3

def test_negative():
    assert add(-1, -1) == -2
"""


def test_code_passes_when_every_test_passes_and_reports_each() -> None:
    v = verify(fenced("def add(a, b):\n    return a + b"), ADD_TESTS, "code")
    assert (v.correct, v.score, v.reason) == (True, 1.0, "2/2 tests passed")
    assert [(t["name"], t["passed"]) for t in v.details["tests"]] == [
        ("test_small", True), ("test_negative", True)]


def test_code_scores_the_fraction_of_tests_passed() -> None:
    v = verify(fenced("def add(a, b):\n    return abs(a + b)"), ADD_TESTS, "code")
    assert (v.correct, v.score) == (False, 0.5)
    assert "test_negative" in v.reason and "AssertionError" in v.reason


def test_code_runs_top_level_asserts_as_one_test() -> None:
    assert verify("def sq(x):\n    return x * x", "assert sq(3) == 9", "code").correct
    v = verify("def sq(x):\n    return x + x", "assert sq(3) == 9", "code")
    assert (v.correct, v.score) == (False, 0.0) and "AssertionError" in v.reason


def test_code_takes_the_last_python_block_and_allows_importing_solution() -> None:
    answer = ("First try:\n```python\ndef f(): return 0\n```\nBetter:\n"
              "```python\ndef f(): return 1\n```")
    assert verify(answer, "from solution import f\nassert f() == 1", "code").correct


def test_code_that_does_not_import_is_wrong_not_an_error() -> None:
    v = verify(fenced("def broken(:\n    pass"), ADD_TESTS, "code")
    assert (v.correct, v.score) == (False, 0.0)
    assert "SyntaxError" in v.reason and "error" not in v.details


def test_code_sees_no_inherited_environment() -> None:
    """conftest sets TEST_*_KEY variables, as a worker would hold real API keys."""
    assert os.environ.get("TEST_OPENAI_KEY")
    tests = "import os\nassert not [k for k in os.environ if 'KEY' in k], dict(os.environ)"
    v = verify("x = 1", tests, "code")
    assert v.correct, v.reason


def test_code_cannot_reach_the_network(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    tests = f"""
import socket
def test_connect():
    socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
def test_resolve():
    socket.getaddrinfo("localhost", 80)
"""
    v = verify("pass", tests, "code")
    assert (v.correct, v.score) == (False, 0.0)
    assert all("network access is disabled" in t["error"] for t in v.details["tests"])
    assert nobody_connected(listener)


@needs_namespaces
def test_network_namespace_alone_stops_connections(listener: socket.socket) -> None:
    """Without the audit hook (which raw syscalls or subprocesses could bypass) the network
    namespace still has nothing to connect to."""
    port = listener.getsockname()[1]
    tests = (f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)")
    res = run_python_tests("", tests, SandboxLimits(block_sockets=False))
    assert res.passed == 0 and "unreachable" in res.failure.lower(), res.failure
    assert res.isolation["network"] == "namespace"
    assert nobody_connected(listener)


def test_audit_hook_alone_stops_connections(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    tests = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)"
    res = run_python_tests("", tests, SandboxLimits(use_namespaces=False))
    assert "network access is disabled" in res.failure
    assert res.isolation["network"] == "audit hook"
    assert nobody_connected(listener)


BOUNDED_FORKS = """
import os, time
def test_forks():
    made = failed = 0
    for _ in range(200):
        try:
            pid = os.fork()
        except OSError:
            failed += 1
            continue
        if pid == 0:
            time.sleep(0.5)
            os._exit(0)
        made += 1
    assert failed == 0, f"{made} forks, then {failed} refused"
"""


def test_process_count_is_bounded() -> None:
    res = run_python_tests("", BOUNDED_FORKS, SandboxLimits(max_processes=16))
    assert res.error is None, res.error
    assert res.total == 1 and res.passed == 0
    made = int(res.tests[0].error.split("AssertionError: ")[1].split()[0])
    assert made < 16, res.tests[0].error


def test_fork_bomb_is_contained_and_leaves_nothing_behind() -> None:
    bomb = ("import os\ndef bomb():\n    while True:\n        try:\n            os.fork()\n"
            "        except OSError:\n            pass\n")
    started = time.monotonic()
    v = verify(fenced(bomb), "def test_bomb():\n    bomb()", "code", timeout_s=2)
    assert time.monotonic() - started < 8
    assert v.correct is False and v.details["timed_out"] and "timed out" in v.reason
    deadline = time.monotonic() + 3
    while sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_processes() == []


def test_an_endless_loop_times_out_keeping_the_tests_that_finished() -> None:
    tests = "def test_quick():\n    assert True\n\ndef test_forever():\n    spin()\n"
    started = time.monotonic()
    v = verify(fenced("def spin():\n    while True:\n        pass"), tests, "code", timeout_s=2)
    assert time.monotonic() - started < 5
    assert (v.correct, v.score) == (False, 0.5)
    assert v.details["timed_out"] and "timed out" in v.reason
    assert v.details["tests"][1]["error"] == "timed out after 2s"


def test_memory_is_limited() -> None:
    v = verify("def hog():\n    return bytearray(2 * 1024**3)", "def test_hog():\n    hog()",
               "code")
    assert v.correct is False and "MemoryError" in v.reason


@needs_namespaces
def test_files_outside_the_scratch_directory_are_read_only(tmp_path: Path) -> None:
    target = tmp_path / "written-by-candidate"
    tests = (f"open('inside.txt', 'w').write('ok')\nopen({str(target)!r}, 'w').write('no')\n")
    res = run_python_tests("", tests, SandboxLimits())
    assert "Read-only file system" in res.failure, res.failure
    assert not target.exists()


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


def test_a_sandbox_that_cannot_bound_processes_refuses_to_run_code(
        monkeypatch: pytest.MonkeyPatch) -> None:
    host = sandbox._Host(root=True, tools={}, namespaces=False, pids_cgroup=None)
    monkeypatch.setattr(sandbox, "_host", lambda: host)
    v = verify("x = 1", "assert x == 1", "code")
    assert v.correct is False and "cannot bound processes" in v.reason


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

