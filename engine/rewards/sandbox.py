"""Run untrusted Python (an agent's answer) against a task's tests, contained.

Every run gets:
- `python -I -B` (no user site, no PYTHON* variables, no script directory on sys.path), started
  with an environment of a few fixed variables: nothing inherited, so no API keys;
- a fresh scratch directory as the working directory, removed afterwards;
- resource limits set (soft = hard) before the candidate's code runs: CPU seconds, address space
  (memory), file size, open files, no core dumps;
- a wall-clock timeout, after which the whole process tree is killed;
- an audit hook in the interpreter that refuses sockets other than local socket pairs and name
  resolution (defence in depth, and a clear error message; off with `block_sockets=False`).

The limits are set by the runner itself, before it imports the candidate, rather than in a
`preexec_fn`: Python documents preexec_fn as unsafe in a process with threads (it may deadlock
between fork and exec), and the score activity calls verifiers from a thread pool.

On Linux, when `unshare` works (as root, or as a user allowed to create user namespaces) the run
also gets, checked once per process by a probe run:
- new network, PID and mount namespaces: no network device but a loopback that is down, so no
  connection leaves the sandbox, whatever the code does (subprocesses and C code included); the
  candidate is PID 1 of its namespace, so when it exits or is killed every process it started dies;
- every mount remounted read-only, and the scratch directory a size-limited tmpfs: the candidate
  cannot change any file outside its scratch directory, even as root;
- all capabilities dropped and no_new_privs set (`setpriv`), so the limits, mounts and namespaces
  cannot be undone from inside.

Process count (fork bombs) is bounded differently by who runs the worker, because RLIMIT_NPROC
is not enforced for root:
- root: a pids cgroup (v1 `pids` hierarchy or cgroup v2 with the pids controller) made per run,
  with `pids.max`; its members are killed and it is removed after the run. Without a writable
  pids cgroup, a root worker refuses to run code (a verifier error) rather than risk the machine.
- non-root: RLIMIT_NPROC. Inside a new user namespace the kernel counts only the sandbox's own
  processes against it; without one it counts every process of the user, so the limit becomes
  the user's current thread count plus the budget.

Without usable namespaces (macOS, containers that forbid them) the run still has the limits,
timeout, audit hook and scratch directory, and `SandboxResult.isolation` says what was in force.
This contains careless or runaway code; it is not a boundary against a determined attacker
(ctypes can make raw system calls, and in the fallback mode the file system is writable): for
that, run the scoring worker in a container or VM of its own.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

RUNNER = Path(__file__).with_name("_code_runner.py")
SETUP = Path(__file__).with_name("_sandbox_setup.py")
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# The one process the sandbox adds to the candidate's (unshare, outside the user namespace).
PROCESS_OVERHEAD = 1
KILL_GRACE_S = 2.0

_JOIN_CGROUP = 'echo 0 > "$0/cgroup.procs" && exec "$@"'


class SandboxLimits(BaseModel):
    """What one run may use. Defaults suit a unit test of a small function."""

    timeout_s: float = Field(default=10.0, gt=0, description="wall clock, start-up included")
    memory_mb: int = Field(default=512, ge=64, description="address space (RLIMIT_AS)")
    max_processes: int = Field(default=32, ge=2,
                               description="processes and threads, the runner's own included")
    max_file_mb: int = Field(default=16, ge=1, description="largest file written (RLIMIT_FSIZE)")
    scratch_mb: int = Field(default=64, ge=1, description="scratch tmpfs size (namespaces only)")
    open_files: int = Field(default=256, ge=16)
    use_namespaces: bool = Field(default=True, description="use unshare where it works")
    block_sockets: bool = Field(default=True, description="the in-interpreter audit hook")


class Outcome(BaseModel):
    name: str
    passed: bool
    error: str = ""


class SandboxResult(BaseModel):
    """What happened to one run. `error` is set only when the sandbox itself failed (a verifier
    error); everything the candidate did wrong shows as failed tests."""

    tests: list[Outcome] = Field(default_factory=list)
    failure: str = Field(default="", description="why the run stopped early (import, timeout)")
    timed_out: bool = False
    exit_code: int | None = None
    error: str | None = None
    output_tail: str = ""
    isolation: dict[str, str] = Field(default_factory=dict)
    duration_s: float = 0.0

    @property
    def total(self) -> int:
        return len(self.tests)

    @property
    def passed(self) -> int:
        return sum(t.passed for t in self.tests)


class _Host(BaseModel):
    """What this machine offers for isolation, found once per process."""

    root: bool
    tools: dict[str, str]
    namespaces: bool
    namespace_problem: str = ""
    pids_cgroup: str | None = None


def _which(name: str) -> str | None:
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), SYSTEM_PATH]))


def _pids_cgroup_root() -> str | None:
    """Where this root process may make a pids cgroup: the v1 `pids` hierarchy or a cgroup v2
    root that hands the pids controller to its children."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        fields = line.split()
        if len(fields) < 4:
            continue
        target, fstype, options = fields[1], fields[2], fields[3].split(",")
        if fstype == "cgroup" and "pids" in options:
            return target
        if fstype == "cgroup2":
            control = Path(target, "cgroup.subtree_control")
            if control.exists() and "pids" in control.read_text().split():
                return target
    return None


def _base_command(host: _Host) -> list[str]:
    unshare = [host.tools["unshare"]]
    if not host.root:
        unshare += ["--user", "--map-root-user"]
    return unshare + ["--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc",
                      "--propagation", "private"]


@functools.cache
def _host() -> _Host:
    root = os.geteuid() == 0 if hasattr(os, "geteuid") else False
    tools = {n: p for n in ("unshare", "setpriv", "sh") if (p := _which(n))}
    host = _Host(root=root, tools=tools, namespaces=False,
                 pids_cgroup=_pids_cgroup_root() if root else None)
    missing = {"unshare", "setpriv"} - tools.keys()
    if missing:
        host.namespace_problem = f"missing tools: {', '.join(sorted(missing))}"
        return host
    host.namespaces = True
    probe = _run(host, "", "", SandboxLimits(timeout_s=30.0))
    if probe.error or probe.failure or probe.exit_code:
        host.namespaces = False
        host.namespace_problem = probe.error or probe.failure or f"exit {probe.exit_code}"
    return host


def _user_thread_count() -> int:
    """Threads of this user now: what RLIMIT_NPROC counts outside a user namespace."""
    uid, total = os.getuid(), 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            total += int(fields.get("Threads", "1"))
    return total


def _env(home: str) -> dict[str, str]:
    """Nothing inherited: the candidate sees no keys, tokens or proxies."""
    return {"LANG": "C.UTF-8", "HOME": home, "TMPDIR": home, "PYTHONHASHSEED": "0",
            "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


class _Plan(BaseModel):
    """The command line of one run and what guards it."""

    argv: list[str]
    limits: dict[str, int | None]
    isolation: dict[str, str]
    cgroup: str | None = None


def _plan(host: _Host, scratch: str, limits: SandboxLimits) -> _Plan | str:
    python = [sys.executable, "-I", "-B", str(RUNNER)]
    lim: dict[str, int | None] = {
        "cpu_s": int(limits.timeout_s) + 1, "memory_bytes": limits.memory_mb << 20,
        "file_bytes": limits.max_file_mb << 20, "open_files": limits.open_files,
        "processes": None,
    }
    iso: dict[str, str] = {}
    argv = python
    use_ns = limits.use_namespaces and host.namespaces
    if use_ns:
        argv = [*_base_command(host), sys.executable, "-I", "-B", str(SETUP), scratch,
                str(limits.scratch_mb), host.tools["setpriv"], "--", *python]
        iso.update(network="namespace", filesystem="read-only mounts, tmpfs scratch",
                   privileges="no capabilities, no_new_privs", cleanup="pid namespace")
    else:
        iso.update(network="none", filesystem="writable (scratch cwd only by convention)",
                   cleanup="process group")
        if limits.use_namespaces:
            iso["namespaces"] = f"unavailable: {host.namespace_problem}"
    if limits.block_sockets:
        iso["network"] = "namespace + audit hook" if use_ns else "audit hook"
    cgroup = None
    if host.root:
        if host.pids_cgroup is None:
            return "running as root without a writable pids cgroup: cannot bound processes"
        cgroup = str(Path(host.pids_cgroup, f"conductor-sandbox-{uuid.uuid4().hex[:12]}"))
        argv = [host.tools.get("sh", "/bin/sh"), "-c", _JOIN_CGROUP, cgroup, *argv]
        iso["processes"] = f"pids cgroup (max {limits.max_processes})"
    elif use_ns:
        lim["processes"] = limits.max_processes
        iso["processes"] = f"RLIMIT_NPROC {limits.max_processes} in a user namespace"
    else:
        lim["processes"] = _user_thread_count() + limits.max_processes
        iso["processes"] = f"RLIMIT_NPROC (user's threads + {limits.max_processes})"
    return _Plan(argv=argv, limits=lim, isolation=iso, cgroup=cgroup)


def _make_cgroup(path: str, limits: SandboxLimits) -> None:
    os.mkdir(path)
    Path(path, "pids.max").write_text(str(limits.max_processes + PROCESS_OVERHEAD))


def _remove_cgroup(path: str) -> None:
    """Kill whatever is left in the cgroup (escaped children of a timed-out run), then remove
    it; the kernel needs a moment to reap killed processes before rmdir succeeds."""
    deadline = time.monotonic() + KILL_GRACE_S
    while True:
        try:
            pids = Path(path, "cgroup.procs").read_text().split()
        except OSError:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the run's process group. The kernel does not let a fork slip past a group kill,
    so one would do; the repeats are cheap insurance. (Waiting for the group to be empty
    instead costs seconds where the host's init is slow to reap the killed processes.)"""
    for _ in range(3):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.01)


def _execute(plan: _Plan, job: dict[str, Any], scratch: str,
             limits: SandboxLimits) -> tuple[bytes, bytes, int | None, bool]:
    """Run the plan; returns stdout, stderr, exit code and whether it timed out."""
    proc = subprocess.Popen(
        plan.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        cwd=scratch, env=_env(scratch), start_new_session=True,
    )
    try:
        out, err = proc.communicate(json.dumps(job).encode(), timeout=limits.timeout_s)
        return out, err, proc.returncode, False
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate(timeout=KILL_GRACE_S * 5)
        return out, err, proc.returncode, True
    finally:
        if proc.poll() is None:
            _kill_group(proc)
            proc.wait()


def _events(stdout: bytes) -> list[dict[str, Any]]:
    events = []
    for line in stdout.decode("utf-8", "replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and "event" in event:
            events.append(event)
    return events


def _result(events: list[dict[str, Any]], stderr: bytes, code: int | None,
            timed_out: bool, limits: SandboxLimits) -> SandboxResult:
    res = SandboxResult(timed_out=timed_out, exit_code=code)
    kinds = {e["event"] for e in events}
    if "ready" not in kinds and not timed_out:
        tail = stderr.decode("utf-8", "replace").strip()[-1500:]
        res.error = f"sandbox failed to start (exit {code}): {tail or 'no output'}"
        return res
    outcomes = {e["name"]: e for e in events if e["event"] == "test"}
    for e in events:
        if e["event"] == "collected":
            for name in e["tests"]:
                done = outcomes.get(name)
                res.tests.append(Outcome(
                    name=name, passed=bool(done and done["passed"]),
                    error=done["error"] if done else _unfinished(timed_out, code, limits)))
        elif e["event"] == "failed":
            res.failure = f"{'solution' if e['stage'] == 'solution' else 'tests'} raised: " \
                          f"{e['error']}"
        elif e["event"] == "done":
            res.output_tail = e.get("output", "")
    if "collected" in kinds and not res.tests and "done" in kinds:
        res.tests.append(Outcome(name="tests.py (top-level asserts)", passed=True))
    if "done" not in kinds and not res.failure:
        res.failure = _unfinished(timed_out, code, limits)
    return res


def _unfinished(timed_out: bool, code: int | None, limits: SandboxLimits) -> str:
    if timed_out:
        return f"timed out after {limits.timeout_s:g}s"
    if code is not None and code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"the interpreter exited (code {code}) before this test finished"


def _run(host: _Host, solution: str, tests: str, limits: SandboxLimits) -> SandboxResult:
    scratch = tempfile.mkdtemp(prefix="conductor-sandbox-")
    try:
        plan = _plan(host, scratch, limits)
        if isinstance(plan, str):
            return SandboxResult(error=plan)
        job = {"solution": solution, "tests": tests, "limits": plan.limits,
               "block_sockets": limits.block_sockets}
        if plan.cgroup:
            _make_cgroup(plan.cgroup, limits)
        try:
            out, err, code, timed_out = _execute(plan, job, scratch, limits)
        finally:
            if plan.cgroup:
                _remove_cgroup(plan.cgroup)
        res = _result(_events(out), err, code, timed_out, limits)
        res.isolation = plan.isolation
        return res
    except OSError as exc:
        return SandboxResult(error=f"sandbox failed: {exc}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_python_tests(solution: str, tests: str,
                     limits: SandboxLimits | None = None) -> SandboxResult:
    """Import `solution` as the module `solution`, then run `tests` in a namespace holding the
    solution's names (so tests may call them directly or `from solution import ...`). Each
    function in the tests whose name starts with `test` is one test; a tests file with none is
    one test that passes when its top-level code (asserts) runs through. Never raises."""
    limits = limits or SandboxLimits()
    started = time.monotonic()
    try:
        res = _run(_host(), solution, tests, limits)
    except Exception as exc:  # the sandbox must never take the scorer down with it
        res = SandboxResult(error=f"sandbox failed: {type(exc).__name__}: {exc}")
    res.duration_s = round(time.monotonic() - started, 3)
    return res
