"""The code sandbox's costs per verified answer, each against its obvious baseline, in one run.

    python -m tests.benchmarks.bench_sandbox [--runs 20]

1. Isolation: a two-case function-call task verified end to end (runner start, candidate import,
   calls, strictly validated events, the parent's comparison) through the backend in force,
   against the same with `code_sandbox = "unconfined"` (the runner under `python -I -S`, limits,
   audit hook and seccomp only).
2. Seccomp and the memory cgroup per run: the same backend and task with each turned off in turn
   (the filter replaced by one that allows every call; the run's cgroups without the memory one).
3. Seccomp per system call, the worst case for a filter: 200,000 stat calls timed by the
   candidate itself, under the allow-list and under the allow-all filter.
Runs alternate. Each line gives the median and the minimum (the least disturbed run: the machine
may be shared) and the ratio of the minima.
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import sys
import time

from conductor_engine.engine.rewards import sandbox, verify
from conductor_engine.engine.rewards.sandbox import run

REFERENCE = json.dumps({"function": "add", "cases": [{"args": [1, 2], "expected": 3},
                                                    {"args": [-1, 1], "expected": 0}]})
ANSWER = "```python\ndef add(a, b):\n    return a + b\n```"
SMALL = {"mode": "call", "solution": "def add(a, b):\n    return a + b\n",
         "cases": [{"function": "add", "args": [1, 2], "kwargs": {}}]}
STAT_CALLS = 200_000
SYSCALLS = {"mode": "call", "solution": (
    "import os, time\ndef add(a, b):\n    started = time.perf_counter()\n"
    f"    for _ in range({STAT_CALLS}):\n        os.stat('.')\n"
    "    return time.perf_counter() - started\n"),
    "cases": [{"function": "add", "args": [1, 2], "kwargs": {}}]}
# one BPF instruction: BPF_RET | BPF_K, SECCOMP_RET_ALLOW
ALLOW_ALL = struct.pack("=HBBI", 0x06, 0, 0, 0x7FFF0000)


def verified(backend: str) -> float:
    sandbox.configure(sandbox.SandboxConfig(backend=backend))  # type: ignore[arg-type]
    sandbox.isolation()  # the probe is not part of a run
    started = time.perf_counter()
    verdict = verify(ANSWER, REFERENCE, "code")
    elapsed = time.perf_counter() - started
    assert verdict.correct, verdict.reason
    return elapsed


def executed(job: dict[str, object], seccomp: bool, memory: bool) -> tuple[float, str]:
    """Wall time of one run, and the value the candidate returned."""
    iso = sandbox.isolation()
    assert iso.backend is not None
    if not memory:
        iso = iso.model_copy(update={"cgroups": {
            k: v for k, v in iso.cgroups.items() if k != "memory"}})
    started = time.perf_counter()
    res = run.execute(iso, iso.backend, dict(job), sandbox.SandboxLimits(timeout_s=120),
                      program=None if seccomp else ALLOW_ALL)
    elapsed = time.perf_counter() - started
    call = res.calls[0] if res.calls else None
    assert call is not None and call.value is not None, res
    return elapsed, call.value


def line(label: str, values: list[float], base: list[float], base_label: str,
         unit: float = 1000, suffix: str = "ms") -> None:
    print(f"{label:28s} {statistics.median(values) * unit:8.1f} (min {min(values) * unit:8.1f})"
          f" {suffix}  vs {base_label:18s} {statistics.median(base) * unit:8.1f} "
          f"(min {min(base) * unit:8.1f}) {suffix}  ratio {min(values) / min(base):.3f}")


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
    runs: dict[tuple[bool, bool], list[float]] = {
        (s, m): [] for s in (True, False) for m in (True, False)}
    per_call: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.runs):
        for (s, m), times in runs.items():
            times.append(executed(SMALL, s, m)[0])
        for s, times in per_call.items():
            times.append(float(executed(SYSCALLS, s, True)[1]) / STAT_CALLS)
    print(f"backend {backend}, {args.runs} runs each")
    line("verified answer, sandboxed", confined, unconfined, "unconfined")
    line("seccomp + memory cgroup", runs[(True, True)], runs[(False, False)], "neither")
    line("seccomp allow-list", runs[(True, True)], runs[(False, True)], "allow-all filter")
    line("memory cgroup", runs[(True, True)], runs[(True, False)], "pids cgroup only")
    line("stat(2) under the allow-list", per_call[True], per_call[False], "allow-all filter",
         unit=1e9, suffix="ns")
    sandbox.configure(sandbox.SandboxConfig())
    return 0


if __name__ == "__main__":
    sys.exit(main())
