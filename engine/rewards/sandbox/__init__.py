"""Run untrusted Python (an agent's answer) isolated, and report what it did.

The candidate runs in a sandbox (`backends`: bubblewrap or our own namespaces) chosen by a probe
(`host`, `run.isolation`): its own file system view with nothing of the host's but a read-only
runtime, no network, an unprivileged uid, no capabilities, a seccomp allow-list (`syscalls`),
cgroups bounding the whole run's processes and memory, resource limits, a timeout, and a PID
namespace whose processes all die with it. With no sandbox available, runs are refused unless
the user opted out (`configure(SandboxConfig(backend="unconfined"))`). docs/concepts/sandbox.md
says what holds where.

Three ways to test a candidate, by how far its result can be trusted:
- `run_io_cases`: stdin in, stdout out (LiveCodeBench style);
- `run_call_cases`: arguments in, a JSON return value out;
  in both, expected values never enter the sandbox: the caller compares (`code_tests`);
- `run_python_tests`: the task's own asserts run beside the candidate; the outcome is reported
  from inside the candidate's process, so a hostile candidate can forge it.

Every function here returns a SandboxResult and never raises.
"""

from __future__ import annotations

import time
from typing import Any

from conductor_engine.engine.rewards.sandbox.host import Isolation, SandboxConfig, configure
from conductor_engine.engine.rewards.sandbox.models import (
    CallEvent,
    IoEvent,
    Outcome,
    SandboxLimits,
    SandboxResult,
)
from conductor_engine.engine.rewards.sandbox.run import execute, isolation

__all__ = [
    "CallEvent",
    "IoEvent",
    "Isolation",
    "Outcome",
    "SandboxConfig",
    "SandboxLimits",
    "SandboxResult",
    "configure",
    "isolation",
    "run_call_cases",
    "run_io_cases",
    "run_python_tests",
]


def _run(job: dict[str, Any], limits: SandboxLimits | None) -> SandboxResult:
    limits = limits or SandboxLimits()
    started = time.monotonic()
    try:
        iso = isolation()
        if iso.backend is None:
            res = SandboxResult(error=iso.refusal)
        else:
            res = execute(iso, iso.backend, job, limits)
    except Exception as exc:  # the sandbox must never take the scorer down with it
        res = SandboxResult(error=f"sandbox failed: {type(exc).__name__}: {exc}")
    res.duration_s = round(time.monotonic() - started, 3)
    return res


def run_python_tests(solution: str, tests: str,
                     limits: SandboxLimits | None = None) -> SandboxResult:
    """Import `solution` as the module `solution`, then run `tests` in a namespace holding its
    names. Each `test*` function the tests define is one test; tests with none are one test
    that passes when the top-level code (asserts) runs through. Forgeable: see module."""
    return _run({"mode": "asserts", "solution": solution, "tests": tests}, limits)


def run_call_cases(solution: str, cases: list[tuple[str, list[Any], dict[str, Any]]],
                   limits: SandboxLimits | None = None) -> SandboxResult:
    """Per case (function, args, kwargs): call the function (a module-level name, or
    `Class.method` on a fresh instance) of the imported solution; `calls[i]` holds case i's
    JSON return value or error."""
    job_cases = [{"function": fn, "args": list(args), "kwargs": dict(kwargs)}
                 for fn, args, kwargs in cases]
    return _run({"mode": "call", "solution": solution, "cases": job_cases}, limits)


def run_io_cases(program: str, inputs: list[str],
                 limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `program` as `__main__` once per input, in a process of its own, its stdin the
    input; `io[i]` holds case i's stdout, exit code and whether it timed out."""
    limits = limits or SandboxLimits()
    return _run({"mode": "io", "solution": program, "inputs": inputs,
                 "case_timeout_s": limits.case_timeout_s or limits.timeout_s,
                 "output_cap": limits.output_kb << 10}, limits)
