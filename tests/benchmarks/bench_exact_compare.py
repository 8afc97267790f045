"""The cost of the exact comparison against the float comparison it replaced.

    python -m tests.benchmarks.bench_exact_compare [--tokens 200000] [--repeat 5]

Two workloads, each timed with the current rules and with the old ones (re-stated below, as
they were: every token through float() and math.isclose, every number value likewise):
- io: an expected stdout of N integer and decimal tokens against an output whose spacing
  differs, so the token-by-token path runs (the line-by-line shortcut does not apply);
- call: a returned list of N integers (and a dict of N/10 entries) against the expected one.
The figure is the best of `--repeat` runs of each, and the ratio new / old.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections.abc import Callable
from typing import Any

from conductor_engine.engine.rewards.code_tests import same_output, same_value

TOLERANCE = 1e-6


def old_token(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    return math.isfinite(x) and math.isclose(x, y, rel_tol=TOLERANCE, abs_tol=TOLERANCE)


def old_output(expected: str, got: str) -> bool:
    want = [line.rstrip() for line in expected.split("\n")]
    have = [line.rstrip() for line in got.split("\n")]
    if want == have:
        return True
    a, b = " ".join(want).split(), " ".join(have).split()
    return len(a) == len(b) and all(map(old_token, a, b))


def old_value(expected: Any, got: Any) -> bool:
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(expected) is type(got) and expected == got
    if isinstance(expected, int | float) and isinstance(got, int | float):
        if isinstance(expected, int) and isinstance(got, int):
            return expected == got
        return math.isclose(expected, got, rel_tol=TOLERANCE, abs_tol=TOLERANCE)
    if isinstance(expected, list) and isinstance(got, list):
        return len(expected) == len(got) and all(map(old_value, expected, got))
    if isinstance(expected, dict) and isinstance(got, dict):
        return expected.keys() == got.keys() and all(old_value(v, got[k])
                                                      for k, v in expected.items())
    return type(expected) is type(got) and expected == got


def best(fn: Callable[[], bool], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        assert fn()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(32)
    tokens = [str(rng.randrange(-10**12, 10**12)) if i % 2 else f"{rng.random():.9f}"
              for i in range(args.tokens)]
    expected = "\n".join(" ".join(tokens[i:i + 10]) for i in range(0, len(tokens), 10))
    got = expected.replace(" ", "  ")  # differs by spacing only: the token path runs
    ints = [rng.randrange(-2**63, 2**63) for _ in range(args.tokens)]
    table = {str(i): [i, float(i) / 3] for i in range(args.tokens // 10)}
    value = [ints, table]
    copy = [list(ints), {k: list(v) for k, v in table.items()}]
    rows = [
        ("io tokens", best(lambda: same_output(expected, got), args.repeat),
         best(lambda: old_output(expected, got), args.repeat)),
        ("call values", best(lambda: same_value(value, copy), args.repeat),
         best(lambda: old_value(value, copy), args.repeat)),
    ]
    print(f"{'workload':<12} {'exact (new)':>12} {'float (old)':>12} {'ratio':>7}")
    for name, new, old in rows:
        print(f"{name:<12} {new * 1e3:>9.1f} ms {old * 1e3:>9.1f} ms {new / old:>7.2f}")
    print(f"({args.tokens:,} tokens / values, best of {args.repeat})")


if __name__ == "__main__":
    main()
