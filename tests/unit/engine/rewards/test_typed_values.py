"""A call case's return value crosses the sandbox boundary with its types (typed_values): the
encoder the candidate's module gets, the decoder the trusted parent runs on any text."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from conductor_engine.engine.rewards.typed_values import (
    CALL_FUNCTION,
    CALL_SOURCE,
    MalformedValue,
    conductor_typed_value,
    decode,
    with_typed_call,
)


def through(value: Any) -> Any:
    """What the parent gets back: encoded, written as JSON by the runner, decoded."""
    return decode(json.dumps(conductor_typed_value(value)))


@pytest.mark.parametrize("value", [
    None, True, False, 0, -1, 2**53 + 1, 2**63, -(10**300), 0.1, -0.0, 1e308, "", "ü",
    [1, [2.5, "x"]], (1, (2,)), frozenset({1, "1", (2, 3)}), {1: 2, "1": 3, (4, 5): [6]},
    {True: None, 2.5: (1,)}, [], (), {},
])
def test_plain_values_come_back_with_their_types(value: Any) -> None:
    got = through(value)
    assert got == value and type(got) is type(value)
    if isinstance(value, dict):
        assert [type(k) for k in got] == [type(k) for k in value]


def test_sets_come_back_as_frozensets_and_subclasses_as_their_base() -> None:
    class Int(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    assert through({1, 2}) == frozenset({1, 2})
    assert type(through(Int(5))) is int and through(Int(5)) == 5
    assert math.isnan(through(math.nan)) and through(math.inf) == math.inf


def test_other_objects_cannot_be_returned() -> None:
    for value in (object(), b"x", 1j, range(3), iter([1])):
        with pytest.raises(TypeError, match="return plain data"):
            conductor_typed_value(value)


@pytest.mark.parametrize("text", [
    "", "not json", '{"a": 1}', '["list"]', '["list", 1]', '["object", []]',
    '["dict", [[1]]]', '["dict", [[1, 2], [1, 3]]]', '["dict", [[1, 2], [true, 3]]]',
    '["dict", [[["list", []], 1]]]', '["set", [["list", []]]]', "1" * 5000,
    "[" * 100000 + "]" * 100000,
])
def test_any_text_decodes_to_plain_data_or_malformed(text: str) -> None:
    with pytest.raises(MalformedValue):
        decode(text)


def test_the_typed_call_is_appended_after_the_candidate_and_calls_its_function() -> None:
    source = with_typed_call("class S:\n    def f(self, x):\n        return {x: (x,)}\n"
                             f"def {CALL_FUNCTION}(*a):\n    return 'shadowed'\n")
    assert source.endswith(CALL_SOURCE)
    space: dict[str, Any] = {}
    exec(compile(source, "solution.py", "exec"), space)
    call = space[CALL_FUNCTION]
    assert decode(json.dumps(call("S.f", [1], {}))) == {1: (1,)}
    with pytest.raises(AttributeError, match="defines no 'g'"):
        call("g", [], {})
