"""The trusted comparison of a candidate's output with the expected value (code_tests): integers
exact, a tolerance only for a float expected value, a strict number grammar, strict types.
Pure functions, no sandbox; the sandboxed paths are in test_code_verifier.py and
tests/security/test_exact_verdicts.py."""

from __future__ import annotations

import math

import pytest

from conductor_engine.engine.rewards.code_tests import (
    parse_reference,
    same_output,
    same_value,
    tuples_to_lists,
)

BASES = (2**53, 2**63, 2**64, 10**9 + 7, 10**18, 10**30, -(2**53), -(2**63))
NEAR = tuple(b + k for b in BASES for k in (-3, -2, -1, 0, 1, 2, 3))
"""Integers near 2^53 (where floats stop holding every integer), 2^63 (int64) and others: a
float tolerance, or a float parse, merges neighbours here."""


# --- integers: exact, in every form ---------------------------------------------------------


def test_an_integer_token_accepts_only_that_integer_near_2_53_and_2_63() -> None:
    for n in NEAR:
        for m in (n + k for k in range(-3, 4)):
            assert same_output(str(n), str(m)) is (m == n), (n, m)
            assert same_output(f"{n} 1", f"{m} 1") is (m == n), (n, m)
            for written in (f"{m}.0", f"{float(m)!r}", f"{m:e}", f"{float(m):.0f}.0"):
                assert not same_output(str(n), written), (n, written)


def test_a_call_value_accepts_only_that_integer_near_2_53_and_2_63() -> None:
    for n in NEAR:
        for m in (n + k for k in range(-3, 4)):
            assert same_value(n, m) is (m == n), (n, m)
            assert same_value([n], [m]) is (m == n) and same_value({"k": n}, {"k": m}) is (m == n)
            x = float(m)
            # a float passes only if its value is exactly n: Python's own int/float == is exact
            assert same_value(n, x) is (x == n), (n, x)


def test_the_reviews_integer_answers_score_nothing() -> None:
    assert not same_output("1000000007", "1000000000")
    assert not same_output("1000000007", "1e9") and not same_output("1000000007", "1.000000007e9")
    assert not same_output(str(10**18 + 1), str(10**18))
    assert not same_value(118264581564861424, 1.1826458e17)
    assert not same_value(118264581564861425, float(118264581564861425))  # ...424.0
    assert not same_value(10**18 + 1, 1e18) and not same_value(10**400, math.inf)


def test_integer_tokens_compare_by_value_at_any_size() -> None:
    assert same_output("7", "+7") and same_output("7", "007") and same_output("0", "-0")
    assert same_output("-7", "-007") and not same_output("-7", "7")
    big = "9" * 5000  # past int()'s 4300-digit limit: compared as text, exactly
    assert same_output(big, "0" + big) and not same_output(big, big[:-1] + "8")


# --- floats: a tolerance only when the expected value is one --------------------------------


def test_a_float_expected_value_accepts_within_the_tolerance() -> None:
    assert same_output("0.5", "0.50000001") and same_output("0.5", ".5")
    assert same_output("3.0", "3") and same_output("1e9", "1000000000")
    assert not same_output("0.5", "0.5001")
    assert same_value(0.1 + 0.2, 0.3) and same_value(3.0, 3) and same_value(1e9, 10**9)
    assert not same_value(1.0, 10**400)  # an int too large for a float is not close to it
    assert not same_output("3", "3.0") and not same_output("3", "2.9999999")


def test_non_finite_values_match_only_themselves() -> None:
    nan, inf = math.nan, math.inf
    assert same_value(nan, nan) and same_value(inf, inf) and not same_value(inf, -inf)
    assert not same_value(1e308, inf) and not same_value(1.0, nan) and not same_value(nan, 1.0)
    assert same_output("inf", "inf") and not same_output("1e308", "inf")
    assert not same_output("1e308", "1e999"), "an overflow is not close to anything"
    assert not same_output("1e999", "2e999"), "two overflows are not equal"
    assert not same_output("0.5", "nan") and not same_output("inf", "Infinity")


# --- the token grammar ----------------------------------------------------------------------


@pytest.mark.parametrize(("expected", "got"), [
    ("1000000 123", "1_000_000 ١٢٣"),  # float() reads both
    ("1000000", "1_000_000"),
    ("123", "١٢٣"),  # Arabic-Indic digits
    ("123", "１２３"),  # fullwidth digits
    ("0.5", "0.5\u200b"),  # a zero-width space
    ("1 2", "1\u00a02"),  # no-break space: only ASCII whitespace separates tokens
    ("1 2", "1\u20032"),
    ("1 2", "1\x1c2"),  # an ASCII separator str.split() would split at
    ("1.5", "1,5"),
    ("10", "0x0a"),
    ("1", "True"),
])
def test_numbers_parse_with_a_strict_grammar(expected: str, got: str) -> None:
    assert not same_output(expected, got)


def test_whitespace_between_lines_and_at_ends_is_free() -> None:
    assert same_output("1 2\n3\n", "1 2   \n3\n\n") and same_output("1\n2", "1 2")
    assert same_output("1 2", "1\t2\r\n") and not same_output("1 2", "1 3")


# --- values: types strict --------------------------------------------------------------------


def test_call_values_are_strict_about_types() -> None:
    assert not same_value(1, True) and not same_value(True, 1) and not same_value(0, False)
    assert not same_value("1", 1) and not same_value(1, "1") and not same_value(None, 0)
    assert same_value(6, 6.0), "an integral float of exactly the value, as the tests' own =="
    assert not same_value(6, 6.5) and not same_value([1], [1, 2])


def test_dict_keys_compare_with_their_types() -> None:
    assert not same_value({"1": 2}, {1: 2}) and not same_value({1: 2}, {"1": 2})
    assert not same_value({1: "a"}, {True: "a"}) and not same_value({1: "a"}, {1.0: "a"})
    assert same_value({(1, "a"): [1, 2.0]}, {(1, "a"): [1, 2.0000000001]})
    assert not same_value({(1, 2): 0}, {(1, 2.0): 0}), "keys are exact: no tolerance"
    assert not same_value({"a": 1}, {"a": 1, "b": 2}) and same_value({}, {})


def test_containers_compare_recursively_and_keep_their_kind() -> None:
    assert same_value([[1, [2, {"x": (3,)}]]], [[1, [2, {"x": (3,)}]]])
    assert not same_value([[1, [2, {"x": (3,)}]]], [[1, [2, {"x": [3]}]]])
    assert not same_value((1, 2), [1, 2]) and not same_value([1, 2], (1, 2))
    assert same_value(frozenset({1, 2}), {2, 1}) and not same_value(frozenset({1}), {True})
    assert not same_value(frozenset({1, 2}), [1, 2])
    assert tuples_to_lists(((1, (2,)), {"a": (3,)})) == [[1, [2]], {"a": [3]}]


def test_literal_asserts_keep_python_types_and_json_cases_read_tuples_as_lists() -> None:
    tests = parse_reference("assert f() == ((1, 2), {3}, {1: 'a'})")
    assert tests.form == "call" and not tests.tuples_as_lists
    assert tests.calls[0].expected == ((1, 2), frozenset({3}), {1: "a"})
    assert parse_reference('{"function": "f", "cases": [{"expected": [1]}]}').tuples_as_lists
    assert parse_reference("assert f() == b'x'").form == "asserts", "bytes: not a plain value"


def test_a_humaneval_check_function_of_literal_asserts_is_call_cases_on_the_entry_point() -> None:
    source = ("METADATA = {'author': 'x'}\n\ndef check(candidate):\n    '''doc'''\n"
              "    assert candidate(2, k=3) == (1, 2), 'message'\n    assert True\n\n"
              "check(pair)\n")
    tests = parse_reference(source)
    assert tests.form == "call" and [(c.function, c.args, c.named, c.expected)
                                     for c in tests.calls] == [("pair", [2], {"k": 3}, (1, 2))]


@pytest.mark.parametrize("body", [
    "    assert helper(1) == 2",  # not the candidate
    "    assert candidate(1) == 2\n    for x in [1]:\n        assert candidate(x)",
    "    assert abs(candidate(1.0) - 0.5) < 1e-6",
], ids=["other-function", "a-loop", "a-tolerance"])
def test_a_check_function_with_anything_else_stays_untrusted_asserts(body: str) -> None:
    tests = parse_reference(f"def check(candidate):\n{body}\n\ncheck(f)\n")
    assert tests.form == "asserts" and not tests.trusted


def test_test_code_that_runs_more_than_check_stays_untrusted() -> None:
    code = "def check(candidate):\n    assert candidate(1) == 2\n\nprint('x')\ncheck(f)\n"
    assert parse_reference(code).form == "asserts"
