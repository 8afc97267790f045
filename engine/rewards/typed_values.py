"""A function-call case's return value, brought out of the sandbox with its Python types.

The sandbox runner reports a return value as JSON, and plain JSON forgets types that decide
equality: `{1: 2}` and `{"1": 2}` both become `{"1": 2}`, a tuple becomes a list, a set cannot
be written at all. So the trusted parent does not call the candidate's function directly: it
appends `CALL_SOURCE` (the two functions below, standard library only) to the candidate's
module and calls `CALL_FUNCTION`, which calls the candidate's function and returns its value in
a tagged form that JSON carries without loss:

- None, bool, int, float, str: as themselves (JSON keeps bool apart from int, an int exact at
  any size up to Python's 4300-digit conversion limit, a float by its shortest repr);
- list, tuple, set/frozenset: `["list" | "tuple" | "set", [items...]]`;
- dict: `["dict", [[key, value], ...]]`, keys encoded like values;
- anything else: the call fails (TypeError), as a value `json.dumps` refused did before.

The encoder runs inside the candidate's process, so the candidate can make it say anything;
that gains nothing, since it could as well return that value. What matters is the other side:
`decode` turns any text into plain data or `MalformedValue`, never an object of the candidate's
making, and the comparison (`code_tests.same_value`) is done here.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

CALL_FUNCTION = "conductor_typed_call"
_TAGS = ("list", "tuple", "set", "dict")


def conductor_typed_value(value: object) -> object:
    """`value` as tagged JSON-ready data (see module). Runs in the sandbox: builtins only."""
    if value is None or isinstance(value, bool | str | float):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, list):
        return ["list", [conductor_typed_value(v) for v in value]]
    if isinstance(value, tuple):
        return ["tuple", [conductor_typed_value(v) for v in value]]
    if isinstance(value, set | frozenset):
        return ["set", [conductor_typed_value(v) for v in value]]
    if isinstance(value, dict):
        return ["dict", [[conductor_typed_value(k), conductor_typed_value(v)]
                         for k, v in value.items()]]
    raise TypeError(f"a return value of type {type(value).__name__} cannot be compared; "
                    "return plain data (None, bool, int, float, str, list, tuple, set, dict)")


def conductor_typed_call(function: str, args: list[object], kwargs: dict[str, object]) -> object:
    """Call `function` (a module-level name, or `Class.method` on a fresh instance) of the
    module this is appended to, and return its value tagged. Runs in the sandbox."""
    owner, _, method = function.rpartition(".")
    space = globals()
    name = owner or method
    if name not in space:
        raise AttributeError(f"the solution defines no {name!r}")
    target = getattr(space[owner](), method) if owner else space[method]
    return conductor_typed_value(target(*args, **kwargs))


CALL_SOURCE = ("\n\n\n" + inspect.getsource(conductor_typed_value) + "\n\n"
               + inspect.getsource(conductor_typed_call))
"""Appended to the candidate's code for call cases (after it, so these names win)."""


def with_typed_call(solution: str) -> str:
    """The candidate's module with the typed call appended."""
    return solution + CALL_SOURCE


class MalformedValue(ValueError):
    """The runner's text is not a tagged value (a candidate that forged it, or a bug)."""


def decode(text: str) -> Any:
    """The plain value a tagged JSON text holds: None, bool, int, float, str, list, tuple,
    frozenset, dict. MalformedValue for anything else, unhashable keys or duplicate keys."""
    try:
        return _decode(json.loads(text))
    except (ValueError, TypeError, RecursionError) as exc:
        if isinstance(exc, MalformedValue):
            raise
        raise MalformedValue(f"not a tagged value: {type(exc).__name__}") from exc


def _decode(node: Any) -> Any:
    if node is None or isinstance(node, bool | int | float | str):
        return node
    if not (isinstance(node, list) and len(node) == 2 and node[0] in _TAGS
            and isinstance(node[1], list)):
        raise MalformedValue("not a tagged value")
    tag, items = node
    if tag == "list":
        return [_decode(v) for v in items]
    if tag == "tuple":
        return tuple(_decode(v) for v in items)
    if tag == "set":
        return frozenset(_decode(v) for v in items)  # TypeError: an unhashable member
    out: dict[Any, Any] = {}
    for pair in items:
        if not (isinstance(pair, list) and len(pair) == 2):
            raise MalformedValue("a dict entry is not a [key, value] pair")
        key = _decode(pair[0])
        if key in out:  # also TypeError for an unhashable key
            raise MalformedValue("a dict with a key twice")
        out[key] = _decode(pair[1])
    return out
