"""Every pattern and scanner that reads a candidate's text runs in linear time: each gets the
worst inputs of its shape at 256 KB (the quadratic forms these replace took minutes on such
inputs: `"0" * 250000 + "x"` printed by a program, `"The answer is a"` + 60,000 spaces + `"b"`
in a reply). Time is the thread's CPU time, so a machine loaded by other work does not fail
the test; the bound is a generous net, not a benchmark: each takes well under 0.3 s on an idle
machine, and a thread's CPU time still stretched past 1 s once on the 2 shared cores during
the whole suite, so the net sits at 5 s, still far below the quadratic forms' 17 s and more."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from conductor_engine.engine.rewards import verify
from conductor_engine.engine.rewards.code_tests import same_output
from conductor_engine.engine.rewards.extract import (
    answer_spans,
    last_code_block,
    strip_latex_text,
)
from conductor_engine.engine.rewards.verifiers import chosen_letter, span_letters
from conductor_engine.engine.text import normalize_text

N = 256 * 1024
BOUND_S = 5.0  # a quadratic scanner takes 17 s to minutes on these inputs here


def _fill(unit: str, tail: str = "") -> str:
    """`unit` repeated to 256 KB, then `tail`."""
    return unit * ((N - len(tail)) // len(unit)) + tail


REPLIES = {
    "answer is, spaces, another word": "The answer is a" + " " * (N - 16) + "b",
    "answer is, many on one line": _fill("the answer is x "),
    "answer is, many, then spaces": _fill("answer is x ")[: N // 2] + " " * (N // 2),
    "answer is, spaces before is": "answer" + " " * N + "isx",
    "answer colon, spaces": "Answer:" + " " * N + "x",
    "answer colon, emphasis": "Answer" + "*_ " * (N // 3) + "x",
    "answer colon, many": _fill("Answer: "),
    "answer word, many": _fill("answer "),
    "final, many": _fill("final "),
    "final, spaces": "final" + " " * N + "x",
    "line prefix": ">#*_ " * (N // 5) + "answer: x",
    "boxes, unclosed": _fill("\\boxed{"),
    "boxes, nested": "\\boxed{" * (N // 14) + "1" + "}" * (N // 14),
    "box, open braces": "\\boxed" + "{" * N,
    "box, spaces": "\\boxed" + " " * N,
    "open braces": "{" * N,
    "close braces": "}" * N,
    "sentence stops": _fill(". "),
    "points": "answer is " + "." * N,
    "fences": _fill("```"),
    "fences, one per line": _fill("```\n"),
    "fences, with a language": _fill("```x"),
    "fence, long header": "```" + "a" * N,
    "text macros": _fill("\\text{"),
    "text macro, spaces": "\\text" + " " * N,
    "letters": _fill("A "),
    "letter is, spaces": "A is" + " " * N + "x",
    "letters is": _fill("(A) is "),
    "letters or": "Answer: " + _fill("A or "),
    "leading letter, spaces": "A" + " " * N + "x",
    "leading spaces": " " * N + "x",
    "words": _fill("the a an "),
}

SCANNERS: dict[str, Callable[[str], Any]] = {
    "answer_spans": answer_spans,
    "last_code_block": last_code_block,
    "strip_latex_text": strip_latex_text,
    "normalize_text": normalize_text,
    "chosen_letter": chosen_letter,
    "span_letters": span_letters,
    "verify exact": lambda text: verify(text, "Paris", "exact"),
    "verify choice": lambda text: verify(text, "B", "choice"),
}


def _timed(work: Callable[[], Any]) -> float:
    started = time.thread_time()
    work()
    return time.thread_time() - started


@pytest.mark.parametrize("scanner", list(SCANNERS))
def test_each_reply_scanner_is_linear_on_its_worst_inputs(scanner: str) -> None:
    scan = SCANNERS[scanner]
    slow = {name: t for name, text in REPLIES.items()
            if (t := _timed(lambda text=text: scan(text))) > BOUND_S}  # type: ignore[misc]
    assert not slow, f"{scanner} took over {BOUND_S}s on: {slow}"


@pytest.mark.parametrize(("expected", "got"), [
    ("0", "0" * N + "x"),
    ("0.5", "0" * N + "x"),
    ("2", "+" + "0" * N + "1"),
    ("1.5", "1." + "0" * N + "e"),
    ("1.5", "." + "0" * N + "x"),
    ("1.5", "1e" + "0" * N + "x"),
    ("1 2", " ".join(["0" * 64 + "x"] * (N // 66))),
])
def test_the_output_comparison_is_linear_on_long_number_like_tokens(expected: str,
                                                                    got: str) -> None:
    assert _timed(lambda: same_output(expected, got)) < BOUND_S
    assert same_output(expected, got) is False
