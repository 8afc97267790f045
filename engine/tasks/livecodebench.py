"""LiveCodeBench rows as code references: test cases in the form the publishers ship them, and
the prompt the benchmark gives the model.

`public_test_cases` is a JSON list of {input, output, testtype}. `private_test_cases` is that
list too in older releases, and in the published ones the JSON text pickled as a `str`, zlib
compressed and base64 encoded. Pickle runs whatever a pickle asks for, so the rows are not
trusted with it: `StrOnlyUnpickler` refuses every class or function a pickle names (the only
way a pickle reaches code), and anything the pickle builds that is not exactly a `str` is a
row error. The decompressed size is bounded before unpickling (MAX_DECOMPRESSED).

Problems come in two kinds:
- stdin (AtCoder, Codeforces): a program reads each input and its stdout is compared;
- functional (LeetCode): `metadata` is JSON naming `func_name`, `starter_code` holds
  `class Solution`, each input is one JSON argument per line and each output one JSON value.
  They become function-call cases on `Solution().<func_name>` (a plain function where the
  starter code has no class), with the arguments parsed here, so trusted code compares what
  the method returns (engine/rewards/code_tests.py). Like the benchmark's own grader, the
  solution runs after a prelude of standard imports (`typing` and friends), since LeetCode's
  starter code uses `List[int]` without importing it.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import pickle
import zlib
from typing import Any

from conductor_engine.engine.contracts.limits import MAX_JSON_REQUEST_BYTES, size_label

MAX_DECOMPRESSED = MAX_JSON_REQUEST_BYTES
"""The most bytes compressed test cases may expand to: a task is far smaller (MAX_TASK_BYTES),
so anything over this is refused before it is unpickled or held in memory whole."""

PRELUDE = ("from typing import *\nfrom collections import *\nfrom functools import *\n"
           "from itertools import *\nfrom heapq import *\nfrom bisect import *\n"
           "from math import *\nimport bisect, collections, functools, heapq, itertools, math, "
           "re, string, sys\n\n")
"""Run before a functional solution, as LiveCodeBench's grader does (its own list is longer)."""


class CaseError(ValueError):
    """A row's test cases cannot be read; the message says why, for the row's error line."""


class StrOnlyUnpickler(pickle.Unpickler):
    """An unpickler that can build nothing but the builtin values pickle makes without naming a
    class; `find_class` refuses every name, so no pickle can reach `os.system`, a constructor
    or any other callable (REDUCE, BUILD, NEWOBJ and INST all need one)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused: the pickle names {module}.{name}; test cases "
                                     "are a pickled str and nothing else")


def unpickle_str(data: bytes) -> str:
    """The `str` a pickle holds; CaseError for a pickle of anything else, or a broken one."""
    try:
        value = StrOnlyUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # pickle raises many kinds on hostile or broken input
        raise CaseError(f"not a pickled string: {type(exc).__name__}: {exc}") from None
    if type(value) is not str:
        raise CaseError(f"the pickle holds a {type(value).__name__}, not a str")
    return value


def decompress(text: str) -> str:
    """base64 → zlib → pickled str, as LiveCodeBench publishes `private_test_cases`."""
    try:
        packed = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise CaseError("neither JSON nor base64") from None
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(packed, MAX_DECOMPRESSED)
    except zlib.error as exc:
        raise CaseError(f"base64 but not zlib data ({exc})") from None
    if inflater.unconsumed_tail:
        raise CaseError(f"decompresses to over {size_label(MAX_DECOMPRESSED)}")
    if not inflater.eof:
        raise CaseError("the zlib data is truncated")
    return unpickle_str(raw)


def read_cases(value: Any) -> list[dict[str, str]]:
    """A test-case column as a list of {input, output, testtype}: a list already, its JSON
    text, or its compressed form. Empty for a missing column."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        text = value if value.lstrip()[:1] in "[{" else decompress(value)
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise CaseError(f"not a JSON list of test cases ({exc})") from None
    if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
        raise CaseError("expected a list of {input, output, testtype} objects")
    return [{"input": str(c.get("input", "")), "output": str(c.get("output", "")),
             "testtype": str(c.get("testtype") or "stdin")} for c in value]


def func_name(metadata: Any) -> str | None:
    """`func_name` of a row's metadata (a JSON object, or its text); None where there is none."""
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata) if metadata.strip() else {}
        except json.JSONDecodeError:
            raise CaseError("column metadata: not JSON") from None
    name = metadata.get("func_name") if isinstance(metadata, dict) else None
    if name is not None and (not isinstance(name, str) or not name.isidentifier()):
        raise CaseError(f"metadata func_name {name!r} is not a Python name")
    return name


def call_reference(cases: list[dict[str, str]], name: str, starter: str) -> str:
    """Functional cases as a function-call reference: each input line one JSON argument."""
    function = f"Solution.{name}" if "class Solution" in starter else name
    calls = []
    for number, case in enumerate(cases, start=1):
        try:
            args = [json.loads(line) for line in case["input"].splitlines() if line.strip()]
            expected = json.loads(case["output"])
        except (json.JSONDecodeError, RecursionError) as exc:
            raise CaseError(f"functional case {number}: not JSON ({exc})") from None
        calls.append({"args": args, "kwargs": {}, "expected": expected})
    return json.dumps({"function": function, "cases": calls, "prelude": PRELUDE})


def prompt(question: str, starter: str | None) -> str:
    """The question as LiveCodeBench asks it: with starter code, complete that code; without,
    write a program over stdin and stdout. Either way one ```python block."""
    if starter:
        task = ("Complete the starter code below to solve the problem, and give your whole "
                "solution in one ```python block.\n\n```python\n" + starter.rstrip() + "\n```")
    else:
        task = ("Write a Python program that reads the input from standard input, solves the "
                "problem and writes the answer to standard output (do not just test it on the "
                "sample inputs). Give the program in one ```python block.")
    return f"### Question\n\n{question.strip()}\n\n### Format\n\n{task}\n\n### Answer\n"
