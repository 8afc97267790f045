"""Pulling the final answer out of a model's long reply.

Models wrap answers in reasoning; verifiers want the answer. These helpers find the forms models
actually use (`\\boxed{...}`, a final "Answer: ..." line, "the answer is (C)", a fenced code
block); the answer is then compared as SQuAD's evaluation does (engine/text.py normalize_text).

Everything here reads text a policy under RL wrote, so every scan is linear in the reply's
length: the few regular expressions left have no two adjacent quantifiers that can match the
same characters, and the answer lines and code fences are found by hand-written scanners
(tests/security/test_linear_parsing.py feeds each its worst inputs).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Literal

_BOX_OR_BRACE = re.compile(r"\\(?:boxed|fbox)[ \t\r\n]*\{|[{}]")
_TEXT_MACRO = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\s*\{([^{}]*)\}")
_MARKER = re.compile(r"[Aa](?<![^\W_][Aa])[Nn][Ss][Ww][Ee][Rr]"
                     r"(?:[ \t*_]*(?P<colon>[:：])|\s+[Ii][Ss]\b)")
"""\banswer, then a colon or "is"; spelled with character classes, which the regex engine
scans for several times faster than an IGNORECASE word."""
_SENTENCE_STOP = re.compile(r"\.(?=\s|\Z)")
_SPACE = re.compile(r"\s+")
_NEGATION = re.compile(r"(?i:not)\b")
_MARKUP = re.compile(r"[ \t*_]+")
_LANG = re.compile(r"[ \t]*([\w+#.-]*)")


@dataclass(frozen=True)
class Span:
    """One place where a reply states its answer: a `\\boxed{}` value, an "Answer: X" line or
    a "the answer is X" phrase. `start`/`end`: where `text` lies in the reply."""

    kind: Literal["boxed", "line"]
    text: str
    start: int
    end: int


def boxed_spans(text: str) -> list[Span]:
    """Every innermost `\\boxed{...}` (or `\\fbox{...}`) value, nested braces included, in
    order; an unclosed box is none. One pass over the braces: linear however deep."""
    found: list[Span] = []
    first = min((i for i in (text.find("\\boxed"), text.find("\\fbox")) if i >= 0), default=-1)
    if first < 0:
        return found
    stack: list[list[int]] = []  # per open brace: [is a box, content start, holds a box]
    for m in _BOX_OR_BRACE.finditer(text, first):
        if m.group() == "}":
            if not stack:
                continue
            is_box, start, holds_box = stack.pop()
            if is_box and not holds_box:
                found.append(Span("boxed", text[start:m.start()].strip(), start, m.start()))
            if stack and (is_box or holds_box):
                stack[-1][2] = 1
        else:
            stack.append([int(m.group() != "{"), m.end(), 0])
    found.sort(key=lambda s: s.start)
    return found


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`), nested braces included."""
    boxes = boxed_spans(text)
    return boxes[-1].text if boxes else None


def strip_latex_text(text: str) -> str:
    """`\\text{Paris}` → `Paris`: models box words in text macros."""
    return _TEXT_MACRO.sub(r"\1", text)


def _markers(text: str) -> list[tuple[int, int, bool]]:
    """Each "answer:" / "final answer:" (`is_line`) and "answer is" (not) in the text: where
    it starts and where its value may begin. "answer" must start a word."""
    found = []
    for m in _MARKER.finditer(text):
        start = m.start()
        before = start
        while before > 0 and text[before - 1] in " \t":  # each blank run is read once
            before -= 1
        if (before < start and text[before - 5:before].lower() == "final"
                and not (before > 5 and (text[before - 6].isalnum() or text[before - 6] == "_"))):
            start = before - 5
        found.append((start, m.end(), m.group("colon") is not None))
    return found


def answer_spans(text: str) -> list[Span]:
    """Every place the reply states an answer, in order: `\\boxed{}` values, "Answer: X" (or
    "Final answer: X") values, which run to the end of their line, and "the answer is X"
    values, which run to the first full stop followed by white space, else to the end of their
    line. A value also ends where the next such marker begins ("Answer: yes. Answer: no" states
    two answers). A line or phrase that holds a box is left out: the box says it ("Final
    answer: \\boxed{5}" is the box 5); so is one with nothing in it, and a phrase that states
    no answer ("we ask what the answer is.", "the answer is not obvious"). Linear in the text: each
    search below moves only forward."""
    boxes = boxed_spans(text)
    box_starts = [b.start for b in boxes]
    markers = _markers(text)
    n = len(text)
    spans: list[Span] = []
    stop = -1  # the first sentence stop at or after the last position searched from
    line_end = -1  # likewise the first line end: many markers on one line share it
    for k, (_, value_at, is_line) in enumerate(markers):
        i = _skip(text, value_at, markup=is_line)
        if not is_line and text[i:i + 1] == ":":
            i = _skip(text, i + 1, markup=False)
        if line_end < i:
            line_end = text.find("\n", i)
            line_end = n if line_end < 0 else line_end
        end = min(line_end, markers[k + 1][0] if k + 1 < len(markers) else n)
        if not is_line:
            if stop < i + 1:
                found = _SENTENCE_STOP.search(text, i + 1)
                stop = found.start() if found else n
            end = min(end, stop)
        if end <= i:
            continue
        value = text[i:end].rstrip(" \t\r\n\f\v*_")
        j = bisect.bisect_left(box_starts, i)
        if not value or (j < len(box_starts) and box_starts[j] < end):
            continue
        if not is_line and (value[0] in ".?!,;)" or _NEGATION.match(value)):
            continue  # "what the answer is." and "the answer is not obvious" state none
        spans.append(Span("line", value, i, i + len(value)))
    return sorted(boxes + spans, key=lambda s: s.start)


def _skip(text: str, i: int, *, markup: bool) -> int:
    """The first position at or after `i` past blanks and emphasis (`markup`), else past
    white space."""
    m = (_MARKUP if markup else _SPACE).match(text, i)
    return m.end() if m else i


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of each fenced block: a ``` opens one, its info string runs to the end
    of that line, and the code to the next ```. Scanned with `str.find`, linear."""
    blocks, pos = [], 0
    while (opening := text.find("```", pos)) >= 0:
        header_end = text.find("\n", opening + 3)
        if header_end < 0:
            break
        closing = text.find("```", header_end + 1)
        if closing < 0:
            break
        lang = _LANG.match(text, opening + 3, header_end)
        blocks.append((lang.group(1) if lang else "", text[header_end + 1:closing]))
        pos = closing + 3
    return blocks


def last_code_block(text: str) -> str:
    """The program in a reply: the last ```python fenced block, else the last unlabelled fenced
    block, else the whole reply (a reply that is nothing but code)."""
    blocks = [(lang.lower(), code) for lang, code in _fenced_blocks(text)]
    for wanted in ({"python", "py", "python3"}, {""}):
        matching = [code for lang, code in blocks if lang in wanted]
        if matching:
            return matching[-1]
    return text
