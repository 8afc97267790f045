"""Write the checked-in benchmark rows of tests/data/shapes/ in each dataset's published shape,
encoded the way its publishers encode them (LiveCodeBench's private tests: JSON text, pickled
as a str, zlib-compressed, base64). Run it again after changing a row:

    python tests/data/shapes/make_rows.py
"""

from __future__ import annotations

import base64
import json
import pickle
import zlib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def lcb_compress(cases: list[dict[str, str]]) -> str:
    """LiveCodeBench's `private_test_cases`: base64(zlib(pickle(json text)))."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode("ascii")


def write(name: str, rows: list[dict[str, Any]]) -> None:
    (HERE / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def livecodebench() -> list[dict[str, Any]]:
    stdin = {
        "question_title": "Sum of Two", "platform": "atcoder", "question_id": "abc999_a",
        "contest_id": "abc999", "contest_date": "2025-01-04T00:00:00", "difficulty": "easy",
        "question_content": "You are given integers A and B. Print A+B.\n\nInput\n\nA B",
        "starter_code": "",
        "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n",
                                          "testtype": "stdin"}]),
        "private_test_cases": lcb_compress([
            {"input": "-5 12\n", "output": "7\n", "testtype": "stdin"},
            {"input": "1000000000 1000000000\n", "output": "2000000000\n",
             "testtype": "stdin"}]),
        "metadata": "{}",
    }
    functional = {
        "question_title": "two-sum", "platform": "leetcode", "question_id": "3999",
        "contest_id": "weekly-contest-999", "contest_date": "2025-01-05T00:00:00",
        "difficulty": "easy",
        "question_content": ("Given an array of integers nums and an integer target, return the "
                             "indices of the two numbers that add up to target."),
        "starter_code": ("class Solution:\n    def twoSum(self, nums: List[int], target: int) "
                         "-> List[int]:\n        "),
        "public_test_cases": json.dumps([{"input": "[2, 7, 11, 15]\n9", "output": "[0, 1]",
                                          "testtype": "functional"}]),
        "private_test_cases": lcb_compress([
            {"input": "[3, 2, 4]\n6", "output": "[1, 2]", "testtype": "functional"},
            {"input": "[3, 3]\n6", "output": "[0, 1]", "testtype": "functional"}]),
        "metadata": json.dumps({"func_name": "twoSum"}),
    }
    bad = {**stdin, "question_id": "abc999_b",
           "private_test_cases": base64.b64encode(zlib.compress(pickle.dumps(
               {"not": "a str"}))).decode("ascii")}
    return [stdin, functional, bad]


def main() -> None:
    write("livecodebench.jsonl", livecodebench())


if __name__ == "__main__":
    main()
