"""The plan parser on hostile replies: a sampling conductor can emit a megabyte of anything.

Each reply must come back as an invalid plan (PlanError, which the plan activity records and
scores 0), fast and without any other exception: a parser that is quadratic, recursive or
memory-hungry on such text blocks the worker's event loop, crashes the attempt and makes Temporal
pay for a new completion. The time bound is a generous safety net, not a measurement
(tests/benchmarks/bench_plan_parser.py measures); linearity and the bound on the text read are
asserted by counting work, which no busy machine can change.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

from conductor_engine.engine.plan import language
from conductor_engine.engine.plan.language import (
    MAX_JSON_CANDIDATES,
    MAX_PLAN_CHARS,
    MAX_REPLY_CHARS,
    PlanError,
    parse_plan,
)

POOL = ["gpt-5", "claude-sonnet-4"]
MB = 1_000_000
SAFETY_S = 5.0

PLAN = 'model_id = ["gpt-5"]\nsubtasks = ["Solve it."]\naccess_list = [[]]'
LISTS = 'model_id = ["gpt-5"]\nsubtasks = ["Solve it."]\naccess_list = '


def _random_text(size: int) -> str:
    return random.Random(7).randbytes(size).decode("utf-8", errors="surrogateescape")


# Whole-megabyte garbage, and the same garbage where a plan's last list starts just before it
# (inside the window the parser reads), so that the list scanner and literal_eval see it too.
GARBAGE: dict[str, Callable[[int], str]] = {
    "many-braces": lambda n: "{" * n,
    "many-brackets": lambda n: "[" * n,
    "deep-valid-json-lists": lambda n: "[" * (n // 2) + "]" * (n // 2),
    "deep-valid-json-objects": lambda n: '{"steps":' * (n // 10) + "[]" + "}" * (n // 10),
    "deep-list-of-objects": lambda n: '[{"a":' * (n // 7) + "1" + "}]" * (n // 7),
    "many-dashes": lambda n: "-" * n,
    "dash-chain": lambda n: "[" + "-" * (n - 3) + "1]",
    "operator-chain": lambda n: "[" + "1+" * (n // 2 - 1) + "1]",
    "not-chain": lambda n: "[" + "not " * (n // 4 - 1) + "1]",
    "many-quotes": lambda n: '"' * n,
    "escaped-quotes": lambda n: '["' + '\\"' * (n // 2 - 1),
    "triple-quotes": lambda n: "'''" * (n // 3),
    "unclosed-string": lambda n: '["' + "x" * (n - 2),
    "partial-json-objects": lambda n: '{"steps": [{"agent": "gpt-5", ' * (n // 30),
    "partial-step-lists": lambda n: '[{"agent": "gpt-5", "subtask": "' * (n // 32),
    "unclosed-fences": lambda n: "```json\n{" * (n // 9),
    "unclosed-think": lambda n: "<think>" * (n // 7),
    "nested-assignments": lambda n: "model_id = [" * (n // 12),
    "huge-integer": lambda n: "[" + "9" * (n - 2) + "]",
    "many-empty-lists": lambda n: "[" + "[]," * (n // 3 - 1) + "]",
    "random-bytes-decoded": _random_text,
    "mixed-openers": lambda n: "[{(" * (n // 3),
    "deep-tuples": lambda n: "[" + "(" * (n - 2) + "]",
    "spaces-after-assignment": lambda n: "model_id =" + " " * (n - 10),
    "many-assignment-words": lambda n: "model_id subtasks " * (n // 18),
    "spaced-labels": lambda n: "Model Ids sub tasks ACCESS list =  " * (n // 35),
    "reasoning-objects": lambda n: '{"reasoning": "model_id = [", "steps": [' * (n // 41),
    "smart-quotes": lambda n: "\u201c" * n,
    "escape-runs": lambda n: '{"steps": "' + "\\u" * (n // 2 - 6),
    "nul-and-surrogates": lambda n: '["\x00\ud800", ' * (n // 7) + "]",
    "think-and-fences": lambda n: "<think>\n```\n</think>\n" * (n // 22),
}


def _whole(make: Callable[[int], str]) -> str:
    return make(MB)


def _after_lists(make: Callable[[int], str]) -> str:
    tail = LISTS + make(MAX_PLAN_CHARS - len(LISTS) - 1_000)
    return "x" * (MB - len(tail) - 1) + "\n" + tail


@pytest.mark.parametrize("kind", sorted(GARBAGE))
@pytest.mark.parametrize("placed", [_whole, _after_lists], ids=["alone", "after-lists"])
def test_a_megabyte_of_hostile_text_is_an_invalid_plan_quickly(
    kind: str, placed: Callable[[Callable[[int], str]], str]
) -> None:
    text = placed(GARBAGE[kind])
    assert len(text) >= 0.9 * MB
    started = time.perf_counter()
    with pytest.raises(PlanError) as raised:  # never RecursionError, MemoryError, ...
        parse_plan(text, POOL)
    assert time.perf_counter() - started < SAFETY_S, "parsing must be linear and bounded"
    assert len(str(raised.value)) < 400, "the error is one readable line, not the input"


# --- work, counted -----------------------------------------------------------------------------


def _work(text: str) -> int:
    """How much work parsing `text` takes, counted rather than timed: every Python line the
    parse runs (the scans, literal_eval, validation) plus every character the C JSON decoder
    reads, including the prefix a failed decode's error counts through to find its line. The
    regular expressions are the only uncounted work: each is used in one forward pass, and
    none can backtrack past a line or a run of spaces."""
    lines = decoded = 0

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal lines
        lines += 1
        return trace

    class CountingDecoder(json.JSONDecoder):
        def raw_decode(self, s: str, idx: int = 0) -> tuple[Any, int]:
            nonlocal decoded
            try:
                value, end = super().raw_decode(s, idx)
            except json.JSONDecodeError as e:
                decoded += (e.pos - idx + 1) + e.pos  # what it read, then the line count
                raise
            except RecursionError:
                decoded += len(s) - idx  # at most the rest of the text
                raise
            decoded += end - idx
            return value, end

    real = json.JSONDecoder
    json.JSONDecoder = CountingDecoder  # type: ignore[misc]
    sys.settrace(trace)
    try:
        with contextlib.suppress(PlanError):
            parse_plan(text, POOL)
    finally:
        sys.settrace(None)
        json.JSONDecoder = real  # type: ignore[misc]
    return lines + decoded


SMALL = 20_000  # twice this, after LISTS, still fits the window


@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_the_work_doubles_at_most_when_the_text_in_the_window_doubles(kind: str) -> None:
    """Linear: 2x the hostile text inside the searched window takes at most about 2x the work
    (the old parser took 4x on a run of `{`: a failed decode at each, counting lines to it)."""
    make = GARBAGE[kind]
    for prefix in ("", LISTS):
        small, big = prefix + make(SMALL), prefix + make(2 * SMALL)
        assert len(big) < MAX_PLAN_CHARS
        once, twice = _work(small), _work(big)
        assert twice <= 2.3 * once + 1_000, (
            f"{kind} {'after the lists' if prefix else 'alone'}: 2x the text took "
            f"{twice / once:.2f}x the work ({once} -> {twice})")


@pytest.mark.parametrize("kind", ["unclosed-think", "nested-assignments", "partial-step-lists",
                                  "random-bytes-decoded", "think-and-fences"])
def test_text_before_the_last_reply_chars_costs_no_work(kind: str) -> None:
    """Bounded: whatever comes before the reply's last MAX_REPLY_CHARS is never read, so a
    reply twice as long, with the same end, takes the same work."""
    tail = GARBAGE[kind](MAX_REPLY_CHARS).rjust(MAX_REPLY_CHARS)  # exactly what is read
    assert _work(GARBAGE[kind](MB) + tail) == _work(tail)


def test_at_most_max_json_candidates_are_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = json.JSONDecoder.raw_decode

    def counting(self: json.JSONDecoder, s: str, idx: int = 0) -> tuple[Any, int]:
        calls.append(idx)
        return real(self, s, idx)

    monkeypatch.setattr(json.JSONDecoder, "raw_decode", counting)
    with pytest.raises(PlanError):
        parse_plan('{"a": 1, "b": {"c": 2}} ' * 10_000, POOL)  # no candidate holds steps
    assert len(calls) == MAX_JSON_CANDIDATES


def test_any_exception_inside_the_parser_is_an_invalid_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The last line of defence: a reply that found a bug (here, one planted in validation)
    is still one invalid plan, recorded, and not a failed activity retried at a new cost."""

    def broken(*args: Any) -> Any:
        raise TypeError("a bug")

    monkeypatch.setattr(language, "_validate", broken)
    with pytest.raises(PlanError, match=r"could not be parsed \(TypeError\)"):
        parse_plan(PLAN, POOL)


def test_a_plan_after_a_megabyte_of_reasoning_is_found() -> None:
    reasoning = "Let me think [about {this} carefully]. " * (MB // 40)
    plan = parse_plan(reasoning + "\n" + PLAN, POOL)
    assert [s.agent for s in plan.steps] == ["gpt-5"]


def test_a_plan_beyond_the_window_is_reported_as_not_found_with_the_limit() -> None:
    text = PLAN + "\n" + "and then I kept talking. " * (MAX_PLAN_CHARS // 20)
    with pytest.raises(PlanError, match=f"within its last {MAX_PLAN_CHARS:,} characters"):
        parse_plan(text, POOL)


def test_a_malformed_draft_before_the_final_lists_does_not_spoil_them() -> None:
    text = "Draft: model_id = [gpt-5, not sure]\nFinal:\n" + PLAN
    assert parse_plan(text, POOL).steps[0].subtask == "Solve it."


def test_json_plan_after_many_json_snippets_is_found() -> None:
    snippets = '{"note": [1, 2, {"x": "y"}]} ' * 1_000
    text = snippets + '{"steps": [{"agent": "gpt-5", "subtask": "Solve it.", "access": []}]}'
    assert parse_plan(text, POOL).steps[0].agent == "gpt-5"


@pytest.mark.parametrize(
    ("literal", "message"),
    [
        ("[[], [0, -1]]", "not earlier steps"),
        ("[[], --1]", "operator '-'"),
        ("[[], 1 + 1]", "operator '+'"),
        ("[[]] * 2", "access_list has 1"),  # what follows the literal is not part of it
        ("[[], [[[[[[[[[0]]]]]]]]]]", "more than 8 deep"),
        ("[[], not_a_value]", "'not_a_value' is not a value"),
        ("[lambda: 0]", "'lambda' is not a value"),
    ],
)
def test_list_literals_are_checked_before_literal_eval(literal: str, message: str) -> None:
    text = 'model_id = ["gpt-5", "gpt-5"]\nsubtasks = ["a", "b"]\naccess_list = ' + literal
    with pytest.raises(PlanError, match=re.escape(message)):
        parse_plan(text, POOL)
