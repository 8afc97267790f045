"""LiveCodeBench rows in their published shape (tests/data/shapes/livecodebench.jsonl, written by
make_rows.py as the publishers encode them): compressed private tests read without trusting
pickle, stdin and functional problems both judged by trusted code in the real sandbox."""

from __future__ import annotations

import base64
import datetime
import json
import os
import pickle
import zlib
from pathlib import Path

import pytest

from conductor_engine.engine.rewards import verify
from conductor_engine.engine.rewards.code_tests import parse_reference
from conductor_engine.engine.tasks import livecodebench as lcb
from conductor_engine.engine.tasks.sources import load_tasks
from tests.paths import DATA

ROWS = DATA / "shapes" / "livecodebench.jsonl"
TWO_SUM = ("```python\nclass Solution:\n    def twoSum(self, nums: List[int], target: int) -> "
           "List[int]:\n        seen = {}\n        for i, n in enumerate(nums):\n"
           "            if target - n in seen:\n                return [seen[target - n], i]\n"
           "            seen[n] = i\n```")


def packed(value: object) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(value))).decode("ascii")


class Boom:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, ("echo pwned",)


def test_compressed_private_tests_decode_to_the_cases_they_were_made_from() -> None:
    cases = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]
    assert lcb.read_cases(packed(json.dumps(cases))) == cases
    assert lcb.read_cases(json.dumps(cases)) == cases


class Plain:
    """An ordinary class: its pickle names it (GLOBAL), and unpickling would build one."""


@pytest.mark.parametrize("value", [Boom(), Plain(), datetime.date(2025, 1, 1), {"a": "b"},
                                   ["x"], {"s"}, b"bytes", 7, None],
                         ids=["os.system", "class-instance", "date", "dict", "list", "set",
                              "bytes", "int", "none"])
def test_the_unpickler_admits_nothing_but_a_str(value: object) -> None:
    with pytest.raises(lcb.CaseError):
        lcb.read_cases(packed(value))


def test_the_unpickler_never_calls_what_a_pickle_names(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Touch:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return os.system, (f"touch {marker}",)

    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):  # GLOBAL and STACK_GLOBAL opcodes
        with pytest.raises(lcb.CaseError, match="refused: the pickle names"):
            lcb.unpickle_str(pickle.dumps(Touch(), protocol=protocol))
    assert not marker.exists()


def test_compressed_data_that_expands_past_the_bound_is_refused_unread() -> None:
    huge = base64.b64encode(zlib.compress(b"\0" * (lcb.MAX_DECOMPRESSED + 1))).decode()
    with pytest.raises(lcb.CaseError, match="decompresses to over"):
        lcb.decompress(huge)
    with pytest.raises(lcb.CaseError, match="neither JSON nor base64"):
        lcb.read_cases("not base64 at all!")


def test_a_bad_row_is_reported_by_number_and_the_others_load() -> None:
    loaded = load_tasks(f"code:{ROWS}")
    assert [t.id for t in loaded.tasks] == ["abc999_a", "3999"]
    assert [(e.line, e.message) for e in loaded.errors] == [
        (3, "column 'private_test_cases': the pickle holds a dict, not a str")]


def test_a_stdin_problem_is_judged_on_public_and_private_cases() -> None:
    task = load_tasks(f"code:{ROWS}").tasks[0]
    assert len(json.loads(task.reference or "")) == 3 and "standard input" in task.question
    good = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    verdict = verify(good, task.reference, "code")
    assert verdict.correct and verdict.details["trusted"] is True
    assert not verify("```python\nprint(3)\n```", task.reference, "code").correct


def test_a_functional_problem_is_call_cases_on_a_fresh_solution_judged_by_trusted_code() -> None:
    task = load_tasks(f"code:{ROWS}").tasks[1]
    assert "class Solution:\n    def twoSum" in task.question, "the starter code is shown"
    assert task.tags == ["easy", "leetcode"]
    tests = parse_reference(task.reference or "")
    assert tests.form == "call" and tests.trusted
    assert [c.function for c in tests.calls] == ["Solution.twoSum"] * 3
    assert tests.calls[1].args == [[3, 2, 4], 6] and tests.calls[1].expected == [1, 2]
    right = verify(TWO_SUM, task.reference, "code")  # `List` unimported: the prelude has it
    assert (right.correct, right.reason) == (True, "3/3 cases passed"), right.reason
    wrong = verify(TWO_SUM.replace("[seen[target - n], i]", "[i, seen[target - n]]"),
                   task.reference, "code")
    assert (wrong.correct, wrong.score) == (False, 0.0)
    assert wrong.details["trusted"] is True
    future = "```python\nfrom __future__ import annotations\n" + TWO_SUM.removeprefix("```python\n")
    assert verify(future, task.reference, "code").correct, "a __future__ import still opens it"


def test_functional_cases_without_a_func_name_or_with_bad_json_are_row_errors(
        tmp_path: Path) -> None:
    row = json.loads(ROWS.read_text().splitlines()[1])
    rows = [{**row, "metadata": "{}"},
            {**row, "question_id": "x2", "public_test_cases": json.dumps(
                [{"input": "[1,", "output": "1", "testtype": "functional"}])}]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    errors = [e.message for e in load_tasks(f"code:{path}").errors]
    assert "no func_name" in errors[0] and "functional case 1: not JSON" in errors[1]
