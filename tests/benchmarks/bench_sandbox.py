"""The code sandbox's start-up overhead: one sandboxed run against the same job unconfined.

    python tests/benchmarks/bench_sandbox.py [--runs 20]

Each run verifies a two-case function-call task end to end (runner start, candidate import,
calls, strictly validated events, the parent's comparison). The baseline is the same job with
`code_sandbox = "unconfined"` (the runner under `python -I`, limits and audit hook only): the
difference is what isolation costs per verified answer (namespaces or bubblewrap, the view's
mounts, pivot_root, the privilege drop, the pids cgroup for a root worker). Runs alternate, and
the figure is the median of each and the ratio sandboxed / unconfined.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from conductor_engine.engine.rewards import sandbox, verify  # noqa: E402

REFERENCE = json.dumps({"function": "add", "cases": [{"args": [1, 2], "expected": 3},
                                                    {"args": [-1, 1], "expected": 0}]})
ANSWER = "```python\ndef add(a, b):\n    return a + b\n```"


def once(backend: str) -> float:
    sandbox.configure(sandbox.SandboxConfig(backend=backend))  # type: ignore[arg-type]
    sandbox.isolation()  # the probe is not part of a run
    started = time.perf_counter()
    verdict = verify(ANSWER, REFERENCE, "code")
    elapsed = time.perf_counter() - started
    assert verdict.correct, verdict.reason
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    sandbox.configure(sandbox.SandboxConfig())
    backend = sandbox.isolation().backend
    if backend is None:
        print("no sandbox available here:", sandbox.isolation().refusal)
        return 1
    confined, unconfined = [], []
    for _ in range(args.runs):
        confined.append(once(backend))
        unconfined.append(once("unconfined"))
    c, u = statistics.median(confined), statistics.median(unconfined)
    print(f"backend            {backend}")
    print(f"sandboxed run      {c * 1000:7.1f} ms (median of {args.runs})")
    print(f"unconfined run     {u * 1000:7.1f} ms")
    print(f"overhead per run   {(c - u) * 1000:7.1f} ms; ratio sandboxed / unconfined "
          f"{c / u:.2f}")
    sandbox.configure(sandbox.SandboxConfig())
    return 0


if __name__ == "__main__":
    sys.exit(main())
