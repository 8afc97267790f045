"""Verifiers: is an answer right, judged against a task's reference?

Each verifier judges one span of the reply, and a reply that states two different answers is
wrong (a hedge must never be right twice). The span is the last `\\boxed{}` value if the reply
has one, else its last "Answer: X" line or "the answer is X" phrase, else the whole reply; every
other box, answer line or phrase must agree with it (`extract.answer_spans`).

- `exact`: SQuAD-style normalised text equality (`text.normalize_text`) of the span. Another
  stated answer agrees when it names the span's answer, alone or among other words ("the
  answer is Paris, the capital" agrees with `\\boxed{Paris}`; "London" does not).
- `choice`: multiple choice, letters A-J. The span must name one letter ("C", "(C)", "C.",
  "option C", or a lone capital A-J in a sentence; "A or B" names two); "X is correct" counts
  as a stated answer too. With none of these, the reply's leading letter ("C." or "**C**"),
  else its last "(C)", else its last standalone capital A-J.
- `math`: math-verify (symbolic and numeric equivalence, LaTeX or plain) of the span, in a
  helper process (`mathcheck`) so it is safe and bounded in time from any thread; every other
  stated answer math-verify can read must also equal the reference, and a span that offers
  alternatives ("1 or 2") is wrong. With no stated answer, math-verify reads the whole reply.
- `code`: the reference holds stdin/stdout cases, function-call cases or Python test code
  (`code_tests`); the reply's last ```python block (or the whole reply) runs in the sandbox
  (`sandbox`) and, for cases, its outputs are compared here, outside the candidate's reach. The
  score is the fraction of cases (or tests) passed, correct only if all pass; a verdict from
  assert-style test code says it is untrusted (`details["trusted"]`).

`verify` never raises. Whatever the candidate's text makes a verifier give up on (math-verify
timing out or running out of memory on the answer, a sandboxed program that dies) scores wrong,
with a reason that says so. Only a verifier that cannot do its job for reasons of its own
(unknown name, malformed reference, a helper or sandbox that cannot start, a bug) returns
correct=False, score 0, a reason starting "verifier error:" and `details["error"]`, so a scorer
can tell it from a wrong answer.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from conductor_engine.engine.contracts.agent_calls import AnswerKey
from conductor_engine.engine.contracts.rewards import Verdict
from conductor_engine.engine.rewards.code_tests import (
    UNTRUSTED,
    CodeTests,
    looks_like_cases,
    parse_reference,
    same_output,
    same_value,
    tuples_to_lists,
)
from conductor_engine.engine.rewards.extract import (
    Span,
    answer_spans,
    last_code_block,
    strip_latex_text,
)
from conductor_engine.engine.rewards.mathcheck import MathCheckError, check_math
from conductor_engine.engine.rewards.sandbox import (
    SandboxLimits,
    SandboxResult,
    run_call_cases,
    run_io_cases,
    run_python_tests,
)
from conductor_engine.engine.rewards.typed_values import (
    CALL_FUNCTION,
    MalformedValue,
    decode,
    with_typed_call,
)
from conductor_engine.engine.text import normalize_text, shorten

VERIFIERS: tuple[str, ...] = ("auto", "exact", "choice", "math", "code")
"""Accepted verifier names. "auto" (or None) guesses from the reference: see `detect_verifier`."""
MAX_PROGRAM_CHARS = 1 << 20
"""A longer program is wrong unrun: no solution is that long, and one of hundreds of MB could
exhaust the sandbox's memory before it starts (our error) instead of being the candidate's."""
MAX_MATH_CHARS = 100_000
"""A longer stated answer is wrong unread (math-verify would time out on it anyway); a reply
with no stated answer is read by its last MAX_MATH_CHARS characters, where its answer is."""

_LETTER_REFERENCE = re.compile(r"^\s*(?:\(([A-Ja-j])\)|([A-J]))\s*[.:]?\s*$")
_LETTER_PREFIX = re.compile(r"^\s*\(?([A-J])[).:\]]")
_IS_CORRECT = re.compile(r"(?<![\w'-])\(?([A-J])\)?\s+is\s+(?:the\s+)?(?i:correct|right)\b")
_LEADING_CHOICE = re.compile(r"[\s*_>#]*[(\[]?([A-J])(?:[)\].:*_]|\s*$)")
_SPAN_CHOICE = re.compile(r"[(\[]?(?:([A-Ja-j])(?:[)\].:*_]|\s*$)"
                          r"|([B-HJ]|[AI](?! (?!(?:and|n?or)\b)[a-z]))(?![\w'-]))")
_OPTION = re.compile(r"(?i:option|choice)\s+")
_ALTERNATIVE = re.compile(r"[)\].:*_]*\s*(?i:or|and|/|,|&|\|)\s*(?i:option\s+)?[*_(\[]*([A-Ja-j])"
                          r"(?![\w'-])")
_PARENTHESISED = re.compile(r"\(([A-J])\)")
_STANDALONE = re.compile(r"(?<![\w'-])([B-HJ]|[AI](?! (?!(?:and|n?or)\b)[a-z]))(?![\w'-])")
"""A lone capital A-J; "A" and "I" only when not the English words ("A bird", "I think")."""
_ALTERNATIVES = re.compile(r"(?i)\bor\b")
_CODE_REFERENCE = re.compile(r"^\s*(?:assert\b|def\s+test)", re.MULTILINE)
_NUMBER = re.compile(
    r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?\s*%?"
    r"|[-+]?\.\d+|[-+]?\d+\s*/\s*\d+"
)
_LATEX_COMMAND = re.compile(r"\\(?:[a-zA-Z]+|[{}%])")
_EXPRESSION = re.compile(r"[\d\sA-Za-z+\-*/^()\[\]{},.=<>!_|]+")
_FUNCTION_NAMES = {"sin", "cos", "tan", "log", "ln", "exp", "sqrt", "pi", "inf", "oo"}
_DATE = re.compile(r"\d{4}-\d{1,2}-\d{1,2}|\d{1,2}/\d{1,2}/\d{2,4}")


def _verdict(verifier: str, correct: bool, reason: str, details: dict[str, Any] | None = None,
             score: float | None = None) -> Verdict:
    return Verdict(verifier=verifier, correct=correct,
                   score=(1.0 if correct else 0.0) if score is None else score,
                   reason=reason, details=details or {})


def _error(verifier: str, message: str, **details: Any) -> Verdict:
    return Verdict(verifier=verifier, correct=False, score=0.0,
                   reason=f"verifier error: {message}", details={"error": message, **details})


# --- auto ---------------------------------------------------------------------------------


def _looks_like_math(reference: str) -> bool:
    text = reference.strip()
    if not text or _DATE.fullmatch(text):
        return False
    if (text.startswith("$") and text.endswith("$")) or "\\boxed" in text:
        return True
    if _NUMBER.fullmatch(text) or _LATEX_COMMAND.search(text):
        return True
    if not _EXPRESSION.fullmatch(text):
        return False
    words = re.findall(r"[A-Za-z]+", text)
    if any(len(w) > 1 and w.lower() not in _FUNCTION_NAMES for w in words):
        return False
    return bool(re.search(r"\d", text) or re.search(r"[+\-*/^=<>]", text))


def detect_verifier(reference: str) -> str:
    """The verifier "auto" picks, from the reference alone:
    1. a single letter A-J, optionally "(B)" or "B." → `choice`;
    2. a line starting `assert` or `def test`, or JSON code cases (`code_tests`) → `code`;
    3. a number ("42", "-3.5", "1,000", "50%", "2/3"), a reference in `$...$` or `\\boxed{}`,
       anything with a LaTeX command (`\\frac`, `\\sqrt`, `\\pi`), or a short expression of
       digits, one-letter variables, known functions and operators ("x^2+1", "(1, 2)") →
       `math` (and if math-verify cannot parse it after all, `exact` is used instead);
    4. anything else (words, dates, codes) → `exact`."""
    if _LETTER_REFERENCE.match(reference):
        return "choice"
    if _CODE_REFERENCE.search(reference) or looks_like_cases(reference):
        return "code"
    if _looks_like_math(reference):
        return "math"
    return "exact"


# --- one span -----------------------------------------------------------------------------


def _primary(spans: list[Span]) -> Span | None:
    """The span that is the answer: the last box, else the last answer line or phrase."""
    boxes = [s for s in spans if s.kind == "boxed"]
    chosen = boxes or spans
    return chosen[-1] if chosen else None


def _hedge(kind: str, first: str, second: str, details: dict[str, Any]) -> Verdict:
    details["hedge"] = [first, second]
    return _verdict(kind, False, f"hedged: the reply answers both {shorten(first, 60)!r} and "
                                 f"{shorten(second, 60)!r}", details)


# --- exact --------------------------------------------------------------------------------


def _agrees(other: str, answer: str) -> bool:
    """Another stated answer (normalised) agrees with the span's if it names it: the same
    words, alone or among others ("that paris is capital" names "paris"). One that never
    names the span's answer ("no" beside `\\boxed{yes}`) is a second answer. Linear: a text
    shorter than the answer cannot hold it, so each search is paid for by its own text."""
    if not other or other == answer:
        return True
    return len(other) > len(answer) and f" {answer} " in f" {other} "


def verify_exact(answer: str, reference: str, timeout_s: float) -> Verdict:
    expected = normalize_text(strip_latex_text(reference))
    if not expected:
        return _error("exact", "the reference is empty after normalisation")
    spans = answer_spans(answer)
    primary = _primary(spans)
    got_text = primary.text if primary is not None else answer
    got = normalize_text(strip_latex_text(got_text))
    details: dict[str, Any] = {"expected": expected, "answer": shorten(got, 200),
                               "found_by": primary.kind if primary is not None else "reply"}
    for span in spans:
        other = normalize_text(strip_latex_text(span.text))
        if not _agrees(other, got):
            return _hedge("exact", got_text, span.text, details)
    if got == expected:
        return _verdict("exact", True, f"matches {shorten(reference, 80)!r}", details)
    return _verdict("exact", False,
                    f"expected {shorten(reference, 80)!r}, got {shorten(got_text, 80)!r}",
                    details)


# --- choice -------------------------------------------------------------------------------


def answer_key(reference: str, verifier: str | None) -> AnswerKey:
    """What the verifier `verifier` (None or "auto": `detect_verifier`'s pick) makes of
    `reference`, for a sim agent to answer it right or wrong on purpose (TaskInfo.key)."""
    name = (verifier or "auto").strip().lower()
    name = detect_verifier(reference) if name == "auto" else name
    return AnswerKey(verifier=name,
                     letter=reference_letter(reference) if name == "choice" else None)


def reference_letter(reference: str) -> str | None:
    """The correct letter from a reference: "B", "(b)", "B.", or "B) Paris"."""
    m = _LETTER_REFERENCE.match(reference) or _LETTER_PREFIX.match(reference)
    if not m:
        return None
    return next(g for g in m.groups() if g).upper()


def span_letters(text: str) -> list[str]:
    """The letters a stated answer names, in order, each once: one for "C", "(c)", "C.
    Paris", "option C", "C, not D", "I'd say C"; two for "A or B", "(A), (B)", "A/B"; none
    for "42" or "a dog"."""
    text = strip_latex_text(text).lstrip(" \t\r\n*_>#")
    if m := _OPTION.match(text):
        text = text[m.end():]
    if m := _SPAN_CHOICE.match(text):
        letters = [(m.group(1) or m.group(2)).upper()]
        if alt := _ALTERNATIVE.match(text, m.end()):
            letters.append(alt.group(1).upper())
        return list(dict.fromkeys(letters))
    return list(dict.fromkeys(_STANDALONE.findall(text)))


def chosen_letter(answer: str) -> tuple[str | None, str]:
    """The letter a reply chose, and how it was found (for the verdict's details); None and
    why when it chose none or several (a hedge)."""
    stated = [(s.start, s.kind, s.text, span_letters(s.text)) for s in answer_spans(answer)]
    stated += [(m.start(), "line", m.group(), [m.group(1)]) for m in _IS_CORRECT.finditer(answer)]
    stated = sorted(x for x in stated if x[3])
    if stated:
        boxes = [x for x in stated if x[1] == "boxed"]
        _, kind, text, letters = (boxes or stated)[-1]
        named = list(dict.fromkeys(letter for x in stated for letter in x[3]))
        if len(named) > 1:
            return None, f"hedged: the reply names {' and '.join(named)}"
        return letters[0], "boxed" if kind == "boxed" else "answer line"
    if m := _LEADING_CHOICE.match(answer):
        if alt := _ALTERNATIVE.match(answer, m.end()):
            return None, f"hedged: the reply names {m.group(1)} and {alt.group(1).upper()}"
        return m.group(1), "leading letter"
    for rx, how in ((_PARENTHESISED, "last (X)"), (_STANDALONE, "last standalone letter")):
        found = rx.findall(answer)
        if found:
            return found[-1], how
    return None, "no letter found"


def verify_choice(answer: str, reference: str, timeout_s: float) -> Verdict:
    expected = reference_letter(reference)
    if expected is None:
        return _error("choice", f"the reference {shorten(reference, 80)!r} is not a letter A-J")
    got, how = chosen_letter(answer)
    details = {"expected": expected, "chosen": got, "found_by": how}
    if got is None:
        reason = how if how.startswith("hedged") else "no choice found"
        return _verdict("choice", False, f"expected {expected}, {reason}", details)
    if got == expected:
        return _verdict("choice", True, f"chose {got}", details)
    return _verdict("choice", False, f"expected {expected}, got {got}", details)


# --- math ---------------------------------------------------------------------------------


class _UnparsedReference(Exception):
    pass


def _math_text(span: Span) -> str:
    """A stated answer as math-verify should read it: a box stays a box."""
    return f"\\boxed{{{span.text}}}" if span.kind == "boxed" else span.text


def verify_math(answer: str, reference: str, timeout_s: float) -> Verdict:
    spans = answer_spans(answer)
    primary = _primary(spans)
    text = _math_text(primary) if primary is not None else answer[-MAX_MATH_CHARS:]
    others = list(dict.fromkeys(_math_text(s) for s in spans if _math_text(s) != text))
    if len(text) > MAX_MATH_CHARS or any(len(o) > MAX_MATH_CHARS for o in others):
        return _verdict("math", False, f"a stated answer is over {MAX_MATH_CHARS:,} characters",
                        {"found_by": "boxed" if primary and primary.kind == "boxed" else "line"})
    try:
        reply = check_math(reference, text, timeout_s, others)
    except MathCheckError as exc:
        return _error("math", str(exc))
    if reply.get("gold_unparsed"):
        raise _UnparsedReference(reference)
    if not reply.get("ok"):
        return _error("math", reply.get("error") or "math-verify failed on the reference")
    gold, got = reply["gold"], reply["answer"]
    details: dict[str, Any] = {"expected": gold[-1:], "extracted": got[-1:],
                               "found_by": primary.kind if primary is not None else "reply"}
    expected = shorten(gold[-1], 80) if gold else shorten(reference, 80)
    if reply.get("failure"):
        details["failure"] = reply["failure"]
        return _verdict("math", False, f"expected {expected}; {reply['failure']}", details)
    if primary is not None and _ALTERNATIVES.search(strip_latex_text(primary.text)):
        details["hedge"] = [primary.text]
        return _verdict("math", False,
                        f"hedged: {shorten(primary.text, 80)!r} offers alternatives", details)
    if reply.get("hedge"):
        return _hedge("math", text, reply["hedge"], details)
    if reply["correct"]:
        return _verdict("math", True, f"equals {expected}", details)
    shown = shorten(got[-1], 80) if got else "no parsable answer"
    return _verdict("math", False, f"expected {expected}, got {shown}", details)


def _verify_math_strict(answer: str, reference: str, timeout_s: float) -> Verdict:
    try:
        return verify_math(answer, reference, timeout_s)
    except _UnparsedReference:
        return _error("math", f"math-verify cannot parse the reference {shorten(reference, 80)!r}")


# --- code ---------------------------------------------------------------------------------


def _last_line(text: str, default: str = "") -> str:
    return (text.strip().splitlines() or [default])[-1]


def _slots(results: list[Any], count: int) -> list[Any]:
    """One result per case: a run that stopped early reported fewer (None: not run)."""
    return (results + [None] * count)[:count]


def _case_outcomes(tests: CodeTests, res: SandboxResult) -> list[tuple[bool, str]]:
    """Each case judged here, by trusted code: (passed, why not)."""
    out: list[tuple[bool, str]] = []
    unrun = _last_line(res.failure, "did not run") if not res.timed_out else "timed out"
    if tests.form == "io":
        for case, io in zip(tests.io, _slots(res.io, len(tests.io)), strict=True):
            if io is None:
                out.append((False, unrun))
            elif io.timed_out:
                out.append((False, "timed out"))
            elif io.truncated:
                out.append((False, "output over the limit"))
            elif same_output(case.output, io.stdout):
                out.append((True, ""))
            else:
                err = _last_line(io.stderr)
                why = f"expected {shorten(case.output.strip(), 60)!r}, " \
                      f"got {shorten(io.stdout.strip(), 60)!r}"
                out.append((False, f"{why} ({shorten(err, 80)})" if err else why))
        return out
    for call_case, call in zip(tests.calls, _slots(res.calls, len(tests.calls)), strict=True):
        if call is None:
            out.append((False, unrun))
        elif call.error is not None or call.value is None:
            out.append((False, shorten(_last_line(call.error or "", "error"), 120)))
        else:
            try:
                got = decode(call.value)
            except MalformedValue:
                out.append((False, "the return value is not plain data"))
                continue
            if tests.tuples_as_lists:
                got = tuples_to_lists(got)
            try:
                same = same_value(call_case.expected, got)
            except RecursionError:  # nested past the stack: the candidate's value, wrong
                same = False
            if same:
                out.append((True, ""))
            else:
                out.append((False, f"expected {_shown(call_case.expected)}, got {_shown(got)}"))
    return out


def _shown(value: Any) -> str:
    """A value for a reason line, as Python writes it (JSON cannot show a tuple or an int
    key); an int past Python's digit limit by its size."""
    try:
        return shorten(repr(value), 60)
    except ValueError:
        return "an integer of over 4300 digits"
    except RecursionError:
        return "a value nested too deep to show"


def _after_prelude(prelude: str, code: str) -> str:
    """The candidate's code after the reference's prelude, its `from __future__` imports
    moved first (they must open the module, and a solution may well start with one)."""
    if not prelude:
        return code
    lines = code.splitlines(keepends=True)
    future = [line for line in lines if line.startswith("from __future__ import")]
    rest = [line for line in lines if not line.startswith("from __future__ import")]
    return "".join(future) + "\n" + prelude + "".join(rest)


def _run_code(code: str, tests: CodeTests, limits: SandboxLimits) -> SandboxResult:
    if tests.form == "io":
        return run_io_cases(code, [c.input for c in tests.io], limits)
    if tests.form == "call":  # the value comes back with its types: see typed_values
        return run_call_cases(with_typed_call(_after_prelude(tests.prelude, code)),
                              [(CALL_FUNCTION, [c.function, c.args, c.named], {})
                               for c in tests.calls], limits)
    return run_python_tests(code, tests.asserts, limits)


def verify_code(answer: str, reference: str, timeout_s: float) -> Verdict:
    try:
        tests = parse_reference(reference)
    except ValueError as exc:
        return _error("code", str(exc))
    code = last_code_block(answer)
    if len(code) > MAX_PROGRAM_CHARS:  # its size alone could stop the sandbox's start
        return _verdict("code", False, f"the program is over {MAX_PROGRAM_CHARS:,} characters",
                        {"form": tests.form, "trusted": tests.trusted})
    res = _run_code(code, tests, SandboxLimits(timeout_s=timeout_s))
    details: dict[str, Any] = {
        "form": tests.form, "trusted": tests.trusted, "output_tail": res.output_tail[-1000:],
        "timed_out": res.timed_out, "isolation": res.isolation, "duration_s": res.duration_s,
    }
    if not tests.trusted:
        details["limits"] = UNTRUSTED
    if res.error:
        return _error("code", res.error, **details)
    if tests.form == "asserts":
        details["tests"] = [t.model_dump() for t in res.tests]
        outcomes = [(t.passed, f"{t.name}: {_last_line(t.error)}") for t in res.tests]
        unit = "tests"
    else:
        outcomes = _case_outcomes(tests, res)
        details["cases"] = [{"passed": ok, "reason": why} for ok, why in outcomes]
        unit = "cases"
    if not outcomes:
        reason = shorten(res.failure, 300) if res.failure else "no tests ran"
        return _verdict("code", False, reason, details)
    passed = sum(ok for ok, _ in outcomes)
    reason = f"{passed}/{len(outcomes)} {unit} passed"
    if res.timed_out:
        reason += " (timed out)"
    first = next((i for i, (ok, _) in enumerate(outcomes) if not ok), None)
    if first is not None:
        where = "" if tests.form == "asserts" else f"#{first + 1}: "
        reason += f"; {where}{shorten(outcomes[first][1], 120)}"
    if not tests.trusted:
        reason += " [untrusted: assert-style tests]"
    return _verdict("code", passed == len(outcomes), reason, details,
                    score=passed / len(outcomes))


# --- dispatch -----------------------------------------------------------------------------

_Check = Callable[[str, str, float], Verdict]
_CHECKS: dict[str, _Check] = {
    "exact": verify_exact, "choice": verify_choice, "math": _verify_math_strict,
    "code": verify_code,
}


def _auto(answer: str, reference: str, timeout_s: float) -> Verdict:
    name = detect_verifier(reference)
    if name != "math":
        verdict = _CHECKS[name](answer, reference, timeout_s)
    else:
        try:
            verdict = verify_math(answer, reference, timeout_s)
        except _UnparsedReference:
            verdict = verify_exact(answer, reference, timeout_s)
            verdict.details["fallback"] = "math-verify could not parse the reference"
    verdict.details["auto"] = True
    return verdict


def verify(answer: str | None, reference: str | None, verifier: str | None = None, *,
           timeout_s: float = 10.0) -> Verdict:
    """Judge `answer` against `reference` with the named verifier (None or "auto": guessed from
    the reference by `detect_verifier`). No reference: correct=None (nothing to check). No
    answer: wrong. Never raises: failures of the verifier itself are verdicts (see module)."""
    name = (verifier or "auto").strip().lower()
    if reference is None or not reference.strip():
        return Verdict(verifier="none", correct=None, score=0.0, reason="no reference answer")
    if name not in VERIFIERS:
        return _error(name, f"unknown verifier {verifier!r}; valid: {', '.join(VERIFIERS)}")
    if answer is None or not answer.strip():
        return _verdict(detect_verifier(reference) if name == "auto" else name, False,
                        "no answer")
    try:
        if name == "auto":
            return _auto(answer, reference, timeout_s)
        return _CHECKS[name](answer, reference, timeout_s)
    except Exception as exc:  # a verifier bug must cost one reward, not the run
        return _error(name, f"{type(exc).__name__}: {exc}")
