"""The cost of reading LiveCodeBench's compressed private tests without trusting pickle, against
the obvious baseline, the benchmark's own `json.loads(pickle.loads(zlib.decompress(b64)))`.

    python -m tests.benchmarks.bench_lcb_cases [--cases 200] [--case-kb 4] [--repeat 5]

The payload is `--cases` stdin cases of about `--case-kb` KiB of input each, encoded as the
publishers do. Both sides decode the same text to the same list; the figure is the best of
`--repeat` runs of each, and the ratio ours / baseline.
"""

from __future__ import annotations

import argparse
import base64
import json
import pickle
import random
import time
import zlib
from collections.abc import Callable
from typing import Any

from conductor_engine.engine.tasks.livecodebench import read_cases


def payload(cases: int, case_kb: int) -> str:
    rng = random.Random(0)
    rows = [{"input": " ".join(str(rng.randrange(10**9)) for _ in range(case_kb * 100)),
             "output": str(rng.randrange(10**9)), "testtype": "stdin"} for _ in range(cases)]
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(rows)))).decode("ascii")


def baseline(text: str) -> Any:
    return json.loads(pickle.loads(zlib.decompress(base64.b64decode(text))))  # noqa: S301


def best(fn: Callable[[str], Any], text: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(text)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--case-kb", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    text = payload(args.cases, args.case_kb)
    assert [c["input"] for c in read_cases(text)] == [c["input"] for c in baseline(text)]
    ours, theirs = best(read_cases, text, args.repeat), best(baseline, text, args.repeat)
    print(f"payload: {len(text) / 2**20:.2f} MiB compressed, {args.cases} cases")
    print(f"baseline (pickle.loads): {theirs * 1000:.1f} ms")
    print(f"str-only unpickler:      {ours * 1000:.1f} ms")
    print(f"ratio ours / baseline:   {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
