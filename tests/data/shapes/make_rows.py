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


def mmlu() -> list[dict[str, Any]]:  # cais/mmlu: `answer` a ClassLabel index
    return [
        {"question": "What is the capital of France?", "subject": "geography",
         "choices": ["Berlin", "Madrid", "Paris", "Rome"], "answer": 2},
        {"question": "Which gas do plants take in for photosynthesis?", "subject": "biology",
         "choices": ["Oxygen", "Carbon dioxide", "Nitrogen", "Helium"], "answer": 1},
        {"question": "2 + 2 = ?", "subject": "math", "choices": ["3", "4"], "answer": 7},
    ]


def mmlu_pro() -> list[dict[str, Any]]:  # TIGER-Lab/MMLU-Pro
    options = [f"{n} J" for n in range(10, 110, 10)]
    return [
        {"question_id": 70, "question": "A force of 10 N moves a body 9 m along it. The work?",
         "options": options, "answer": "I", "answer_index": 8, "cot_content": "",
         "category": "physics", "src": "stemez-Physics"},
        {"question_id": 71, "question": "Which is a prime number?",
         "options": ["4", "6", "7", "8", "9"], "answer": "C", "answer_index": 2,
         "cot_content": "", "category": "math", "src": "ori_mmlu-elementary_mathematics"},
    ]


def aime() -> list[dict[str, Any]]:  # AIME 2024 (ID/Problem/Answer) and 2025 (lowercase)
    return [
        {"ID": "2024-I-1", "Problem": "Find the remainder when 2024 is divided by 1000.",
         "Solution": "It is $\\boxed{24}$.", "Answer": 24},
        {"id": "2025-I-2", "problem": "What is 6 times 7?", "answer": "042"},
        {"id": "2025-I-3", "problem": "Half of 5?", "answer": "2.5"},
    ]


def math500() -> list[dict[str, Any]]:  # HuggingFaceH4/MATH-500
    return [
        {"problem": "Compute $\\frac{1}{2}+\\frac{1}{3}$.", "solution": "$\\boxed{\\frac56}$",
         "answer": "\\frac{5}{6}", "subject": "Prealgebra", "level": 2,
         "unique_id": "test/prealgebra/1.json"},
    ]


def rlpr() -> list[dict[str, Any]]:  # openbmb/RLPR-Train-Dataset (verl-style parquet rows)
    system = {"role": "system", "content": "Think step by step, then give the answer."}
    return [
        {"data_source": "WebInstruct-verified", "ability": "physics",
         "prompt": [system, {"role": "user", "content": "What is the SI unit of force?"}],
         "reward_model": {"ground_truth": "the newton", "style": "rule"},
         "extra_info": {"index": 0, "split": "train"}},
        {"data_source": "WebInstruct-verified", "ability": "math",
         "prompt": [system, {"role": "user", "content": "Simplify 2x + 3x."}],
         "reward_model": {"ground_truth": "5x", "style": "rule"},
         "extra_info": {"index": 1, "split": "train"}},
    ]


def gpqa_diamond() -> list[dict[str, Any]]:  # Idavidrein/gpqa, gpqa_diamond: a few of its columns
    return [
        {"Pre-Revision Question": "…", "Question": "Which particle carries the strong force?",
         "Correct Answer": "Gluon", "Incorrect Answer 1": "Photon",
         "Incorrect Answer 2": "W boson", "Incorrect Answer 3": "Graviton",
         "Explanation": "Gluons mediate QCD.", "Record ID": "recGPQA0001",
         "High-level domain": "Physics", "Subdomain": "Particle physics"},
    ]


HUMANEVAL_METADATA = "\n\nMETADATA = {\n    'author': 'jt',\n    'dataset': 'test'\n}\n\n\n"


def humaneval() -> list[dict[str, Any]]:  # openai_humaneval
    return [
        {"task_id": "HumanEval/900",
         "prompt": ("from typing import List\n\n\ndef evens(numbers: List[int]) -> List[int]:\n"
                    '    """ Keep the even numbers, in order.\n    >>> evens([1, 2, 4])\n'
                    '    [2, 4]\n    """\n'),
         "canonical_solution": "    return [n for n in numbers if n % 2 == 0]\n",
         "test": HUMANEVAL_METADATA + (
             "def check(candidate):\n    assert candidate([]) == []\n"
             "    assert candidate([1, 2, 3, 4]) == [2, 4]\n"
             "    assert candidate([-2, 7]) == [-2], \"negative evens stay\"\n"
             "    assert True, \"This prints if this assert fails 2 (good for debugging!)\"\n"),
         "entry_point": "evens"},
        {"task_id": "HumanEval/901",
         "prompt": 'def half(x: float) -> float:\n    """ Half of x. """\n',
         "canonical_solution": "    return x / 2\n",
         "test": HUMANEVAL_METADATA + (
             "def check(candidate):\n    assert candidate(4.0) == 2.0\n"
             "    assert abs(candidate(1.0) - 0.5) < 1e-6\n"),
         "entry_point": "half"},
    ]


def mbpp() -> list[dict[str, Any]]:  # mbpp "full" (text, test_list) and "sanitized" (prompt)
    return [
        {"task_id": 901, "text": "Write a function to find the larger of two numbers.",
         "code": "def bigger(a, b):\n    return max(a, b)",
         "test_list": ["assert bigger(1, 2) == 2", "assert bigger(-1, -5) == -1",
                       "assert bigger(3, 3) == 3"],
         "test_setup_code": "", "challenge_test_list": []},
        {"source_file": "Benchmark Questions Verification V2.ipynb", "task_id": 902,
         "prompt": "Write a function to find the area of a circle of radius r.",
         "code": "import math\ndef area(r):\n    return math.pi * r * r",
         "test_imports": ["import math"],
         "test_list": ["assert math.isclose(area(1), 3.141592653589793, rel_tol=0.001)"]},
    ]


def main() -> None:
    write("livecodebench.jsonl", livecodebench())
    write("mmlu.jsonl", mmlu())
    write("mmlu_pro.jsonl", mmlu_pro())
    write("aime.jsonl", aime())
    write("math500.jsonl", math500())
    write("rlpr.jsonl", rlpr())
    write("gpqa_diamond.jsonl", gpqa_diamond())
    write("humaneval.jsonl", humaneval())
    write("mbpp.jsonl", mbpp())


if __name__ == "__main__":
    main()
