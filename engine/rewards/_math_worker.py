"""A helper process for the math verifier: reads one JSON request per line on stdin, answers one
JSON line on stdout.

Why a process: math-verify bounds parsing and comparison with signal.alarm, which works only in
a main thread, and the score activity calls verifiers from worker threads. Here math-verify runs
in this process's main thread, so its own timeouts work; the parent kills the process if even
they fail (a computation stuck inside C code, where no signal handler runs). An address-space
limit keeps a runaway expression (10^{10^{10}}) from eating the machine's memory.

Executed by path with `python -I`; imports only the standard library and math-verify.
"""

from __future__ import annotations

import json
import logging
import resource
import sys
from typing import Any

MEMORY_LIMIT = 2 << 30


class _Warnings(logging.Handler):
    """Collects math-verify's warnings: it reports its own timeouts only by logging them."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage()[:200])


_warnings = _Warnings()


def _wrap_gold(gold: str) -> str:
    """A bare reference like `x^2+1` or `\\frac12` is LaTeX without delimiters; math-verify
    only reads LaTeX inside them, so wrap it."""
    if "$" in gold or "\\boxed" in gold or "\\(" in gold or "\\[" in gold:
        return gold
    return f"${gold}$"


def _without_percent(text: str) -> str:
    """A percent sign dropped: "50%" reads as 50 and only as 50. math-verify reads it both as 50
    and as 0.5, so one answer would be right against two different references."""
    return text.replace("\\%", "").replace("%", "")


def _parsed(found: list[Any]) -> bool:
    """math-verify falls back to the raw string when sympy cannot read it; that is no parse."""
    return any(not isinstance(item, str) for item in found)


def _integer(gold: list[Any]) -> int | None:
    """The reference's value when it is an integer (`1000000007`, `10^9+7`), else None."""
    from sympy import Integer

    found = [g for g in gold if not isinstance(g, str)]
    return int(found[0]) if found and isinstance(found[0], Integer) else None


def _exact_verdict(answer: list[Any], value: int) -> bool | None:
    """Whether the parsed answer is exactly the integer `value`; None to leave it to
    math-verify.

    math-verify compares a number written with a point at its float precision (about 15
    digits): `1.0 \\times 10^{18}` equals 10^18+1 there, and a right `9.007199254740989
    \\times 10^{15}` can fail. Here each float in the answer is read as the decimal it was
    written as (an exact rational) and the answer evaluated exactly: a rational value is right
    only if it is that integer. "x = 5" is read by its right side, "5%" also as 5 (as
    math-verify does). A float-free answer that is not a rational (`\\log_2 32`, a set) is
    left to math-verify's symbolic comparison, which is exact; one holding a float cannot
    prove an integer and is wrong."""
    from math_verify.grader import get_pct_val
    from sympy import Eq, Float, Rational

    expr = next((a for a in answer if not isinstance(a, str)), None)
    if expr is None:  # nothing sympy could read: math-verify compares the text
        return None
    if isinstance(expr, Eq):
        expr = expr.rhs
    forms = [expr, *([pct] if (pct := get_pct_val(expr)) is not None else [])]
    symbolic = False
    for form in forms:
        floats = form.atoms(Float)
        exact = form.xreplace({f: Rational(str(f)) for f in floats}).doit()
        if exact.is_Rational:
            if exact == value:
                return True
        elif not floats:
            symbolic = True
    return None if symbolic else False


def _timed_out() -> bool:
    return any("timeout" in w.lower() for w in _warnings.messages)


def _judge(gold: list[Any], text: str, timeout: int) -> tuple[bool, list[Any]]:
    """Whether the answer `text` equals the parsed reference, and the answer as parsed."""
    from math_verify import parse, verify
    from math_verify.utils import timeout as math_timeout

    answer = parse(_without_percent(text), parsing_timeout=timeout)
    integer = _integer(gold)
    exact = None  # an integer reference: no float tolerance (_exact_verdict)
    if integer is not None and answer:
        exact = math_timeout(timeout)(_exact_verdict)(answer, integer)
    correct = exact if exact is not None else bool(answer) and verify(
        gold, answer, timeout_seconds=timeout)
    return bool(correct), answer


def check(request: dict[str, Any], progress: Any = None) -> dict[str, Any]:
    """Judge `answer`, and then each of `others` (the reply's other stated answers), against
    `gold`. The reference is ours: its failures are errors. Everything after it reads the
    candidate's text, so a timeout, a memory error or any exception there is the answer's
    `failure` (a wrong answer, not an error). `progress` is told when that part begins."""
    from math_verify import parse

    timeout = max(1, int(request.get("timeout", 5)))
    reference = _without_percent(request["gold"])
    gold = parse(_wrap_gold(reference), parsing_timeout=timeout)
    if not _parsed(gold):
        gold = parse(reference, parsing_timeout=timeout)
    if _timed_out():
        return {"ok": False, "error": "math-verify timed out reading the reference"}
    if not _parsed(gold):
        return {"ok": False, "gold_unparsed": True, "gold": [], "answer": []}
    reply: dict[str, Any] = {"ok": True, "correct": False, "gold": [str(g) for g in gold],
                             "answer": [], "failure": None, "hedge": None}
    if progress is not None:
        progress()
    try:
        correct, answer = _judge(gold, request["answer"], timeout)
        reply["answer"] = [str(a) for a in answer]
        for other in request.get("others", []) if correct else []:
            if _timed_out():
                break
            agrees, parsed = _judge(gold, other, timeout)
            if _parsed(parsed) and not agrees:
                correct, reply["hedge"] = False, other
                break
        if _timed_out():
            correct, reply["failure"] = False, "math-verify timed out on the answer"
        reply["correct"] = correct
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # the candidate's text made math-verify give up: its
        # TimeoutException is a BaseException; MemoryError and RecursionError come here too
        why = "timed out" if "timeout" in type(exc).__name__.lower() else type(exc).__name__
        reply["correct"] = False
        reply["failure"] = f"math-verify gave up on the answer ({why})"
    return reply


def main() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    try:
        import math_verify  # noqa: F401  (import now, so the first request is not slow)
    except Exception as exc:
        print(json.dumps({"ready": False, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return
    print(json.dumps({"ready": True}), flush=True)
    logging.getLogger("math_verify").addHandler(_warnings)
    logging.getLogger("math_verify").propagate = False

    def progress() -> None:
        print(json.dumps({"stage": "answer"}), flush=True)

    for line in sys.stdin:
        _warnings.messages.clear()
        try:
            reply = check(json.loads(line), progress)
        except BaseException as exc:  # report anything, MemoryError and timeouts included
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
        reply["warnings"] = _warnings.messages
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
