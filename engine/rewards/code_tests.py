"""A code task's tests, in the forms real code benchmarks use, judged by trusted code.

A `code` reference is one of:
- stdin/stdout cases (LiveCodeBench, Codeforces): `{"io": [{"input": "...", "output": "..."}]}`
  or LiveCodeBench's own list `[{"input": ..., "output": ..., "testtype": "stdin"}]`;
- function-call cases: `{"function": "name", "cases": [{"args": [...], "kwargs": {...},
  "expected": ...}]}` (`"Class.method"` calls a method of a fresh instance, the LeetCode form);
- Python test code: asserts or `test*` functions (HumanEval, MBPP). When every statement is
  `assert name(literals) == literal` (MBPP's form) it is read as function-call cases; any other
  test code runs beside the candidate and its verdict is marked untrusted (see UNTRUSTED).

For io and call cases the expected values never enter the sandbox: the candidate's stdout or
JSON return value comes back and is compared here, on plain data, so an object whose `__eq__`
always says True, an early exit or a forged result line earns nothing.
"""

from __future__ import annotations

import ast
import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from conductor_engine.engine.text import shorten

UNTRUSTED = ("assert-style tests run inside the candidate's process, so a hostile candidate can "
             "forge their outcome (exit early, write result lines, return an object equal to "
             "anything); give stdin/stdout or function-call cases for rewards you train on")
FLOAT_TOLERANCE = 1e-6


class IoCase(BaseModel):
    input: str
    output: str


class CallCase(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    function: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z_][\w.]*$")
    args: list[Any] = Field(default_factory=list)
    named: dict[str, Any] = Field(default_factory=dict, alias="kwargs")
    expected: Any


class CodeTests(BaseModel):
    """One reference, in one form."""

    form: Literal["io", "call", "asserts"]
    io: list[IoCase] = Field(default_factory=list)
    calls: list[CallCase] = Field(default_factory=list)
    asserts: str = ""

    @property
    def trusted(self) -> bool:
        return self.form != "asserts"


class _Cases(BaseModel):
    function: str
    cases: list[dict[str, Any]] = Field(min_length=1)


def _from_json(data: Any) -> CodeTests:
    if not data:
        raise ValueError("no cases")
    if isinstance(data, list):  # LiveCodeBench: stdin cases only without a function name
        if any(c.get("testtype", "stdin") != "stdin" for c in data if isinstance(c, dict)):
            raise ValueError('functional LiveCodeBench cases need {"function": ..., "cases": ...}')
        return CodeTests(form="io", io=[IoCase.model_validate(c, strict=False) for c in data])
    if not isinstance(data, dict):
        raise ValueError("a JSON code reference is an object or a list of cases")
    if "io" in data:
        if not data["io"]:
            raise ValueError("no io cases")
        return CodeTests(form="io", io=[IoCase.model_validate(c) for c in data["io"]])
    spec = _Cases.model_validate(data)
    calls = []
    for case in spec.cases:
        if "expected" not in case and "input" in case:  # LiveCodeBench functional
            args = [json.loads(line) for line in str(case["input"]).splitlines() if line.strip()]
            case = {"args": args, "expected": json.loads(str(case["output"]))}
        calls.append(CallCase.model_validate({"function": spec.function, **case}))
    return CodeTests(form="call", calls=calls)


def _literal_call(stmt: ast.stmt) -> CallCase | None:
    """`assert name(literal, ...) == literal` as a call case, else None."""
    if not (isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Compare)):
        return None
    cmp = stmt.test
    if len(cmp.ops) != 1 or not isinstance(cmp.ops[0], ast.Eq):
        return None
    call = cmp.left
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
        return None
    try:
        args = [_jsonable(ast.literal_eval(a)) for a in call.args]
        kwargs = {k.arg: _jsonable(ast.literal_eval(k.value)) for k in call.keywords if k.arg}
        expected = _jsonable(ast.literal_eval(cmp.comparators[0]))
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None
    if len(kwargs) != len(call.keywords):
        return None
    return CallCase(function=call.func.id, args=args, named=kwargs, expected=expected)


def _jsonable(value: Any) -> Any:
    """A literal as JSON data (tuples become lists); TypeError for what JSON cannot hold."""
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError("not finite")
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _jsonable(v) for k, v in value.items()}
    raise TypeError(type(value).__name__)


def _from_python(source: str) -> CodeTests:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return CodeTests(form="asserts", asserts=source)  # the sandbox reports the error
    body = [s for s in tree.body
            if not (isinstance(s, ast.ImportFrom) and s.module == "solution")]
    calls = [_literal_call(s) for s in body]
    if body and all(c is not None for c in calls):
        return CodeTests(form="call", calls=[c for c in calls if c is not None])
    return CodeTests(form="asserts", asserts=source)


def parse_reference(reference: str) -> CodeTests:
    """The tests a code reference holds. ValueError: a JSON reference of an unknown shape."""
    text = reference.strip()
    if text[:1] in "[{":
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None
        if data is not None:
            try:
                return _from_json(data)
            except (ValidationError, ValueError, TypeError, AttributeError) as exc:
                raise ValueError(f"malformed code cases: {shorten(str(exc), 300)}") from exc
    return _from_python(reference)


def looks_like_cases(reference: str) -> bool:
    """Whether a reference is JSON code cases (for the "auto" verifier)."""
    try:
        parse = parse_reference(reference)
    except ValueError:
        return reference.strip()[:1] in "[{" and ('"io"' in reference or '"cases"' in reference)
    return parse.form != "asserts" and reference.strip()[:1] in "[{"


# --- comparison (trusted: plain data on both sides) --------------------------------------


def same_value(expected: Any, got: Any) -> bool:
    """JSON values equal: types must agree (True is not 1), floats within FLOAT_TOLERANCE."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(expected) is type(got) and expected == got
    if isinstance(expected, int | float) and isinstance(got, int | float):
        if isinstance(expected, int) and isinstance(got, int):
            return expected == got
        return math.isclose(expected, got, rel_tol=FLOAT_TOLERANCE, abs_tol=FLOAT_TOLERANCE)
    if isinstance(expected, list) and isinstance(got, list):
        return len(expected) == len(got) and all(map(same_value, expected, got))
    if isinstance(expected, dict) and isinstance(got, dict):
        return expected.keys() == got.keys() and all(same_value(v, got[k])
                                                      for k, v in expected.items())
    return type(expected) is type(got) and expected == got


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _same_token(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    return math.isfinite(x) and math.isclose(x, y, rel_tol=FLOAT_TOLERANCE,
                                             abs_tol=FLOAT_TOLERANCE)


def same_output(expected: str, got: str) -> bool:
    """Stdout equal line by line, ignoring trailing spaces and trailing blank lines; failing
    that, token by token with numbers within FLOAT_TOLERANCE."""
    want, have = _lines(expected), _lines(got)
    if want == have:
        return True
    a, b = " ".join(want).split(), " ".join(have).split()
    return len(a) == len(b) and all(map(_same_token, a, b))
