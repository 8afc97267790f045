"""The code sandbox's costs per verified answer, each against its obvious baseline, in one run.

    python tests/benchmarks/bench_sandbox.py [--runs 20]

1. Isolation: a two-case function-call task verified end to end (runner start, candidate import,
   calls, strictly validated events, the parent's comparison) through the backend in force,
   against the same with `code_sandbox = "unconfined"` (the runner under `python -I -S`, limits,
   audit hook and seccomp only).
2. Seccomp and the memory cgroup: the same backend, with each turned off in turn (the filter
   replaced by one that allows every call, the run's cgroups without the memory one), on the
   same task and on a system-call-heavy one (the worst case for a filter: 200,000 stat calls).
Runs alternate, and each figure is a median and a ratio against its baseline.
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from conductor_engine.engine.rewards import sandbox, verify  # noqa: E402
from conductor_engine.engine.rewards.sandbox import run  # noqa: E402

REFERENCE = json.dumps({"function": "add", "cases": [{"args": [1, 2], "expected": 3},
                                                    {"args": [-1, 1], "expected": 0}]})
ANSWER = "```python\ndef add(a, b):\n    return a + b\n```"
SMALL = {"mode": "call", "solution": "def add(a, b):\n    return a + b\n",
         "cases": [{"function": "add", "args": [1, 2], "kwargs": {}}]}
SYSCALLS = {"mode": "call", "solution": (
    "import os\ndef add(a, b):\n    for _ in range(200000):\n        os.stat('.')\n"
    "    return a + b\n"), "cases": [{"function": "add", "args": [1, 2], "kwargs": {}}]}
# one BPF instruction: BPF_RET | BPF_K, SECCOMP_RET_ALLOW
ALLOW_ALL = struct.pack("=HBBI", 0x06, 0, 0, 0x7FFF0000)


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def verified(backend: str) -> float:
    sandbox.configure(sandbox.SandboxConfig(backend=backend))  # type: ignore[arg-type]
    sandbox.isolation()  # the probe is not part of a run

    def once() -> None:
        verdict = verify(ANSWER, REFERENCE, "code")
        assert verdict.correct, verdict.reason

    return timed(once)


def executed(job: dict[str, object], seccomp: bool, memory: bool) -> float:
    iso = sandbox.isolation()
    assert iso.backend is not None
    if not memory:
        iso = iso.model_copy(update={"cgroups": {
            k: v for k, v in iso.cgroups.items() if k != "memory"}})

    def once() -> None:
        res = run.execute(iso, iso.backend, dict(job),  # type: ignore[arg-type]
                          sandbox.SandboxLimits(timeout_s=60),
                          program=None if seccomp else ALLOW_ALL)
        assert res.calls and res.calls[0] and res.calls[0].value == "3", res

    return timed(once)


def line(label: str, value: float, base: float, base_label: str) -> None:
    print(f"{label:38s} {value * 1000:7.1f} ms   vs {base_label:22s} {base * 1000:7.1f} ms"
          f"   ratio {value / base:.3f}")


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
        confined.append(verified(backend))
        unconfined.append(verified("unconfined"))
    sandbox.configure(sandbox.SandboxConfig(backend=backend))  # type: ignore[arg-type]
    variants = {(job, s, m): [] for job in ("small", "syscalls")
                for s, m in ((True, True), (False, True), (True, False), (False, False))}
    jobs = {"small": SMALL, "syscalls": SYSCALLS}
    for _ in range(args.runs):
        for (job, s, m), times in variants.items():
            times.append(executed(jobs[job], s, m))
    med = {k: statistics.median(v) for k, v in variants.items()}
    c, u = statistics.median(confined), statistics.median(unconfined)
    print(f"backend {backend}, median of {args.runs} runs each")
    line("verified answer, sandboxed", c, u, "unconfined")
    for job in ("small", "syscalls"):
        full = med[(job, True, True)]
        line(f"{job}: seccomp + memory cgroup", full, med[(job, False, False)], "neither")
        line(f"{job}: seccomp allow-list", full, med[(job, False, True)], "allow-all filter")
        line(f"{job}: memory cgroup", full, med[(job, True, False)], "pids cgroup only")
    sandbox.configure(sandbox.SandboxConfig())
    return 0


if __name__ == "__main__":
    sys.exit(main())
