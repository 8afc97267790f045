"""A code task's tests, in the forms real code benchmarks use, judged by trusted code.

A `code` reference is one of:
- stdin/stdout cases (LiveCodeBench, Codeforces): `{"io": [{"input": "...", "output": "..."}]}`
  or LiveCodeBench's own list `[{"input": ..., "output": ..., "testtype": "stdin"}]`;
- function-call cases: `{"function": "name", "cases": [{"args": [...], "kwargs": {...},
  "expected": ...}], "prelude": "..."}` (`"Class.method"` calls a method of a fresh instance,
  the LeetCode form; the optional prelude is code run before the candidate's, e.g. imports);
- Python test code: asserts or `test*` functions (HumanEval, MBPP). When every statement is
  `assert name(literals) == literal` (MBPP's form), or the code is HumanEval's `def
  check(candidate):` of such asserts on `candidate` followed by `check(entry_point)`, it is
  read as function-call cases (imports, docstrings, `assert True` and literal constants such as
  `METADATA` are dropped, since no test code runs); any other test code runs beside the
  candidate and its verdict is marked untrusted (see UNTRUSTED).

For io and call cases the expected values never enter the sandbox: the candidate's stdout or
return value (typed, see `typed_values`) comes back and is compared here, on plain data, so an
object whose `__eq__` always says True, an early exit or a forged result line earns nothing.
The comparison is exact for integers and type-strict (`same_value`, `same_output`; the rules
are below and in docs/concepts/verdicts.md).
"""

from __future__ import annotations

import ast
import json
import math
import re
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
    tuples_as_lists: bool = Field(
        default=False, description="JSON call cases: a returned tuple compares as a list (JSON "
        "has no tuples; LiveCodeBench's grader does the same). Python asserts keep them apart.")
    prelude: str = Field(
        default="", max_length=4000,
        description="call cases: trusted code run before the candidate's (the standard imports "
        "LiveCodeBench's grader gives LeetCode solutions, which use `List` unimported)")

    @property
    def trusted(self) -> bool:
        return self.form != "asserts"


class _Cases(BaseModel):
    function: str
    cases: list[dict[str, Any]] = Field(min_length=1)
    prelude: str = ""


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
    return CodeTests(form="call", calls=calls, tuples_as_lists=True, prelude=spec.prelude)


def _literal_call(stmt: ast.stmt, callee: tuple[str, str] | None = None) -> CallCase | None:
    """`assert name(literal, ...) == literal` as a call case, else None. With `callee`
    (parameter, function): only calls of that parameter, as calls of the function (HumanEval's
    `candidate(...)` inside `check(candidate)`)."""
    if not (isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Compare)):
        return None
    cmp = stmt.test
    if len(cmp.ops) != 1 or not isinstance(cmp.ops[0], ast.Eq):
        return None
    call = cmp.left
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
        return None
    if callee is not None and call.func.id != callee[0]:
        return None
    try:
        args = [_jsonable(ast.literal_eval(a)) for a in call.args]
        kwargs = {k.arg: _jsonable(ast.literal_eval(k.value)) for k in call.keywords if k.arg}
        expected = _literal(ast.literal_eval(cmp.comparators[0]))
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None
    if len(kwargs) != len(call.keywords):
        return None
    name = callee[1] if callee is not None else call.func.id
    return CallCase(function=name, args=args, named=kwargs, expected=expected)


def _inert(stmt: ast.stmt) -> bool:
    """A statement that tests nothing: a docstring, `pass`, `assert True`, an import, or a
    constant assigned a literal (HumanEval's `METADATA = {...}`). Dropped when every other
    statement is a call case, since the cases never run test code."""
    if isinstance(stmt, ast.Pass | ast.Import | ast.ImportFrom):
        return True
    if isinstance(stmt, ast.Expr):
        return isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)
    if isinstance(stmt, ast.Assert):
        return isinstance(stmt.test, ast.Constant) and bool(stmt.test.value)
    if isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
        try:
            ast.literal_eval(stmt.value)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return False
        return True
    return False


def _check_run(stmt: ast.stmt) -> ast.Call | None:
    """The call of a `check(...)` statement, else None."""
    if (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == "check"):
        return stmt.value
    return None


def _check_calls(body: list[ast.stmt]) -> list[CallCase] | None:
    """HumanEval's form, `def check(candidate): assert candidate(...) == literal ...` then
    `check(entry_point)`: each assert as a call case on the entry point. None for test code of
    any other shape, or one statement that is not such an assert."""
    checks = [s for s in body if isinstance(s, ast.FunctionDef) and s.name == "check"]
    runs = [s for s in body if _check_run(s) is not None]
    if len(checks) != 1 or len(runs) != 1:
        return None
    check, run = checks[0], _check_run(runs[0])
    if run is None or not all(_inert(s) for s in body if s is not check and s is not runs[0]):
        return None
    params = check.args
    if (check.decorator_list or len(params.args) != 1 or params.posonlyargs
            or params.kwonlyargs or params.vararg or params.kwarg):
        return None
    if len(run.args) != 1 or run.keywords or not isinstance(run.args[0], ast.Name):
        return None
    callee = (params.args[0].arg, run.args[0].id)
    cases = [_literal_call(s, callee) for s in check.body if not _inert(s)]
    if not cases or any(c is None for c in cases):
        return None
    return [c for c in cases if c is not None]


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


def _literal(value: Any) -> Any:
    """An expected literal kept with its Python types (tuple, set, dict keys of any plain
    type), since the candidate's value comes back typed (`typed_values`); TypeError for what
    the comparison does not know (complex, bytes, Ellipsis)."""
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, list):
        return [_literal(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_literal(v) for v in value)
    if isinstance(value, set | frozenset):
        return frozenset(_literal(v) for v in value)
    if isinstance(value, dict):
        return {_literal(k): _literal(v) for k, v in value.items()}
    raise TypeError(type(value).__name__)


def _from_python(source: str) -> CodeTests:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return CodeTests(form="asserts", asserts=source)  # the sandbox reports the error
    if (checked := _check_calls(tree.body)) is not None:
        return CodeTests(form="call", calls=checked)
    calls = [_literal_call(s) for s in tree.body if not _inert(s)]
    if calls and all(c is not None for c in calls):
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
#
# The rules, for every trusted form (docs/concepts/verdicts.md has them as a table):
# - integers compare exactly, as Python ints of any size: no tolerance ever applies to an
#   integer expected value;
# - a float expected value accepts an int or float within FLOAT_TOLERANCE, relative OR absolute
#   (`math.isclose(rel_tol=1e-6, abs_tol=1e-6)`); NaN matches only NaN, an infinity only
#   itself, and a non-finite answer never matches a finite expected value;
# - the tolerance belongs to the expected value: the reference says "float" by being one.


def _close(expected: float, got: float) -> bool:
    if not (math.isfinite(expected) and math.isfinite(got)):
        return expected == got or (math.isnan(expected) and math.isnan(got))
    return math.isclose(expected, got, rel_tol=FLOAT_TOLERANCE, abs_tol=FLOAT_TOLERANCE)


def _strict_key(value: Any) -> Any:
    """A hashable stand-in for a dict key or set member that keeps its type: `1`, `1.0`,
    `True` and `"1"` are four different keys here (Python would merge the first three)."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, float):
        return ("float", "nan" if math.isnan(value) else value)
    if isinstance(value, str):
        return ("str", value)
    if value is None:
        return ("none",)
    if isinstance(value, tuple):
        return ("tuple", tuple(_strict_key(v) for v in value))
    if isinstance(value, frozenset | set):
        return ("set", frozenset(_strict_key(v) for v in value))
    raise TypeError(f"{type(value).__name__} is not a plain key")


def same_value(expected: Any, got: Any) -> bool:
    """A returned value equals the expected one, both plain data (`typed_values.decode`).

    Type-strict: bool is never int (True is not 1); an int expected value accepts an int of
    exactly that value, or a float that is exactly that integer (`6.0` for `6`, as the
    benchmarks' own `==` does, but never `1.1826458e17` for `118264581564861424`); a float
    expected value accepts an int or float within the tolerance (see above); str and None only
    themselves. Containers: a list only a list, a tuple only a tuple (JSON cases, which have no
    tuples, turn returned tuples into lists first: `tuples_to_lists`), a set/frozenset only a
    set/frozenset with the same members by `_strict_key`, a dict only a dict with the same keys
    by `_strict_key` (`{1: 2}` is not `{"1": 2}`) and values compared recursively."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(expected) is type(got) and expected == got
    if isinstance(expected, int):
        if isinstance(got, float):
            return math.isfinite(got) and got.is_integer() and int(got) == expected
        return isinstance(got, int) and expected == got
    if isinstance(expected, float):
        if isinstance(got, int):
            try:
                got = float(got)
            except OverflowError:
                return False
        return isinstance(got, float) and _close(expected, got)
    if isinstance(expected, list | tuple):
        return (type(got) is type(expected) and len(expected) == len(got)
                and all(map(same_value, expected, got)))
    if isinstance(expected, set | frozenset):
        return isinstance(got, set | frozenset) and _keys(expected) == _keys(got)
    if isinstance(expected, dict):
        if not isinstance(got, dict) or len(got) != len(expected):
            return False
        have = {_strict_key(k): v for k, v in got.items()}
        want = {_strict_key(k): v for k, v in expected.items()}
        return have.keys() == want.keys() and all(same_value(v, have[k])
                                                  for k, v in want.items())
    return type(expected) is type(got) and expected == got


def _keys(values: Any) -> frozenset[Any]:
    return frozenset(_strict_key(v) for v in values)


def tuples_to_lists(value: Any) -> Any:
    """A returned value as LiveCodeBench's grader sees it against JSON: tuples as lists (dict
    keys, which a list cannot be, kept as they are)."""
    if isinstance(value, list | tuple):
        return [tuples_to_lists(v) for v in value]
    if isinstance(value, dict):
        return {k: tuples_to_lists(v) for k, v in value.items()}
    return value


_TOKEN = re.compile(r"[^ \t\n\r\f\v]+")
_OTHER_SEPARATORS = "\x1c\x1d\x1e\x1f"
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
"""The only number tokens: ASCII digits, a sign, a point, an exponent. No underscores
(`1_000`), no other scripts' digits (`١٢٣`), no `inf`/`nan` (those match only themselves),
which Python's float() would all accept. Matched in linear time: no two quantifiers here can
take the same digits (a program's output is the candidate's text)."""


def _lines(text: str) -> list[str]:
    lines = [line.rstrip(" \t\r\f\v") for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _integer(token: str) -> str | None:
    """An integer token in one canonical spelling (no plus sign, no leading zeros, no "-0"),
    compared as text: exact at any size, without Python's int() digit limit."""
    sign, body = (token[0], token[1:]) if token[:1] in ("+", "-") else ("", token)
    if not (body.isascii() and body.isdigit()):
        return None
    digits = body.lstrip("0") or "0"
    return "-" + digits if sign == "-" and digits != "0" else digits


def _same_token(expected: str, got: str) -> bool:
    """One output token against the expected one. An integer token accepts only an integer
    token of the same value (`3.0`, `3e0` and `2.9999999` are not `3`); a decimal token (point
    or exponent) accepts a number token within the tolerance; any other token only itself."""
    if expected == got:
        return True
    want = _integer(expected)
    if want is not None:
        return _integer(got) == want
    if _NUMBER.fullmatch(expected) is None or _NUMBER.fullmatch(got) is None:
        return False
    x, y = float(expected), float(got)  # an overflow is inf: never close to anything
    return math.isfinite(x) and math.isfinite(y) and _close(x, y)


def _tokens(lines: list[str]) -> list[str]:
    """Tokens separated by ASCII whitespace only (str.split() also splits at a no-break space,
    U+2003 and the ASCII separators 0x1C-0x1F). str.split() where it means the same, as it is
    several times faster than a regular expression."""
    text = " ".join(lines)
    if text.isascii() and not any(c in text for c in _OTHER_SEPARATORS):
        return text.split()
    return _TOKEN.findall(text)


def same_output(expected: str, got: str) -> bool:
    """Stdout equal line by line, ignoring trailing spaces and trailing blank lines; failing
    that, token by token (split on ASCII whitespace only) by `_same_token`."""
    want, have = _lines(expected), _lines(got)
    if want == have:
        return True
    a, b = _tokens(want), _tokens(have)
    return len(a) == len(b) and all(map(_same_token, a, b))
