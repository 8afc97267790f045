"""How fast the plan parser rejects hostile replies, against json.loads of a same-size document.

No servers: the parser alone, on the kinds of text that once made it quadratic, recursive or
memory-hungry (a megabyte of `{`, deep nesting, a run of `-`, ...). For each kind it prints the
median parse time of a 1 MB reply, the ratio to json.loads of a valid 1 MB JSON document (the
obvious baseline: one linear C pass over the same number of characters), and two growth ratios:
a 2 MB reply against a 1 MB one, and, inside the window the parser reads (MAX_PLAN_CHARS), 2x
the hostile text after a plan's lists against 1x. About 2 means linear; about 1, bounded.

    python -m tests.benchmarks.bench_plan_parser            # --runs N
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Callable

from conductor_engine.engine.plan.language import MAX_PLAN_CHARS, PlanError, parse_plan

POOL = ["gpt-5", "claude-sonnet-4"]
MB = 1_000_000
LISTS = 'model_id = ["gpt-5"]\nsubtasks = ["Solve it."]\naccess_list = '

KINDS: dict[str, Callable[[int], str]] = {
    "many {": lambda n: "{" * n,
    "many [": lambda n: "[" * n,
    "deep JSON": lambda n: "[" * (n // 2) + "]" * (n // 2),
    "many -": lambda n: "[" + "-" * (n - 3) + "1]",
    "many quotes": lambda n: '"' * n,
    "partial JSON": lambda n: '{"steps": [{"agent": "gpt-5", ' * (n // 30),
    "many strings": lambda n: "[" + '"ab",' * (n // 5 - 1) + "]",
}


def _median_s(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _parse_time(text: str, runs: int) -> float:
    """Median seconds to parse `text` (built beforehand, so only parsing is timed)."""

    def parse() -> None:
        with contextlib.suppress(PlanError):
            parse_plan(text, POOL)

    return _median_s(parse, runs)


def _after_lists(make: Callable[[int], str], n: int) -> str:
    return "reasoning\n" + LISTS + make(n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    document = json.dumps({"steps": [{"agent": "gpt-5", "subtask": "x" * 80, "access": []}]
                          * (MB // 120)})
    baseline = _median_s(lambda: json.loads(document), args.runs)
    half = (MAX_PLAN_CHARS - 200) // 2
    print(f"json.loads of a valid {len(document) / MB:.2f} MB document: {baseline * 1e3:.2f} ms")
    print(f"{'reply':14} {'1 MB (ms)':>10} {'/ json':>7} {'2 MB / 1 MB':>12} "
          f"{'in window 2x / 1x':>18}")
    for name, make in KINDS.items():
        one = _parse_time(make(MB), args.runs)
        two = _parse_time(make(2 * MB), args.runs)
        small = _parse_time(_after_lists(make, half), args.runs)
        big = _parse_time(_after_lists(make, 2 * half), args.runs)
        print(f"{name:14} {one * 1e3:10.2f} {one / baseline:7.2f} {two / one:12.2f} "
              f"{big / small:18.2f}")

if __name__ == "__main__":
    main()
