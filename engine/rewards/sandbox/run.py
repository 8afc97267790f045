"""One run of the runner under the chosen backend: start it, bound it, read it, clean up.

- The job goes in on stdin; the runner's events come back on stdout. Both output pipes are read
  by threads with a byte cap, so a candidate that floods its output cannot exhaust the worker.
- A wall-clock timeout kills the run: the sandbox's processes from the inside out (the PID
  namespace's init first, so every process the candidate started, `setsid` ones included, dies
  with it, and `unshare`/`bwrap` reap it), then what is left of the process group; the worker
  waits for its own child, so a timed-out run leaves no zombie.
- The run's cgroups bound its processes (`pids.max`) and its memory, all processes together
  (`memory.max` / `memory.limit_in_bytes`, swap excluded); they are removed after the run.
- Each event line is validated (`models.Event`); the first malformed or out-of-order line ends
  the reading and fails the run as the candidate's doing, never as a verifier error: nothing the
  candidate can cause may turn its run into an infrastructure failure (which would leave it out
  of its GRPO group instead of scoring it).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.rewards.sandbox import backends, syscalls
from conductor_engine.engine.rewards.sandbox.backends import SANDBOX_DIR, Backend
from conductor_engine.engine.rewards.sandbox.host import (
    STATE,
    Isolation,
    candidates,
    cgroup_problem,
    survey,
)
from conductor_engine.engine.rewards.sandbox.models import (
    CallEvent,
    Collected,
    Done,
    Event,
    Failed,
    IoEvent,
    Outcome,
    Ready,
    SandboxLimits,
    SandboxResult,
    TestEvent,
)

KILL_GRACE_S = 2.0
STDOUT_CAP = 8 << 20
STDERR_CAP = 64 << 10
PROCESS_OVERHEAD = 3  # bwrap's monitor and init, or unshare and setup, beside the runner
_EVENT: TypeAdapter[Any] = TypeAdapter(Event)
# sh -c JOIN sh CGROUP... -- COMMAND...: enter each cgroup, then become the command
_JOIN_CGROUPS = ('for g; do shift; [ "$g" = -- ] && break; echo 0 > "$g/cgroup.procs" || exit 125; '
                 'done; exec "$@"')


def _env(home: str) -> dict[str, str]:
    """Nothing inherited: the candidate sees no keys, tokens or proxies."""
    return {"LANG": "C.UTF-8", "HOME": home, "TMPDIR": home, "PATH": "/usr/bin:/bin",
            "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


class _Capped:
    """Reads a pipe to the end on a thread, keeping at most `cap` bytes."""

    def __init__(self, stream: Any, cap: int) -> None:
        self.data = bytearray()
        self.overflow = False
        self._thread = threading.Thread(target=self._read, args=(stream, cap), daemon=True)
        self._thread.start()

    def _read(self, stream: Any, cap: int) -> None:
        with contextlib.suppress(OSError, ValueError):
            while chunk := stream.read1(1 << 16):
                room = cap - len(self.data)
                if len(chunk) > room:
                    self.overflow = True
                self.data += chunk[:max(room, 0)]

    def join(self, timeout: float) -> bytes:
        self._thread.join(timeout)
        return bytes(self.data)


def _descendants(pid: int) -> list[int]:
    """The living descendants of `pid`, parents before children (/proc/PID/task/*/children).
    A process or thread may exit at any point of the walk (the candidate's processes come
    and go as they like): one that vanished has no children left to find, never an error."""
    found, queue = [], [pid]
    while queue:
        try:
            tasks = list(Path(f"/proc/{queue.pop(0)}/task").iterdir())
        except OSError:  # the process was reaped before its task list could be read
            continue
        for task in tasks:
            with contextlib.suppress(OSError, ValueError):
                kids = [int(k) for k in (task / "children").read_text().split()]
                found += kids
                queue += kids
    return found


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill the run and reap the worker's own child. The sandbox's processes go first, so
    `unshare`/`bwrap` see their child die and exit by themselves: killed together, the PID
    namespace's init would be orphaned to PID 1, a zombie where the worker is PID 1."""
    if proc.poll() is None:  # not reaped yet, so its pid (and its children's) is still its own
        for pid in _descendants(proc.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=KILL_GRACE_S)
    for _ in range(3):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(0.01)
    proc.wait()


def _make_cgroups(parents: dict[str, str], limits: SandboxLimits) -> list[str]:
    """A pids and a memory cgroup for one run (one directory where v2 holds both)."""
    made: dict[str, str] = {}
    name = f"conductor-sandbox-{uuid.uuid4().hex[:12]}"
    try:
        for controller, parent in parents.items():
            path = made.get(parent) or str(Path(parent, name))
            if parent not in made:
                os.mkdir(path)
                made[parent] = path
            if controller == "pids":
                Path(path, "pids.max").write_text(str(limits.max_processes + PROCESS_OVERHEAD))
            elif controller == "memory":
                _limit_memory(Path(path), limits.memory_mb << 20)
    except OSError:
        for path in made.values():
            _remove_cgroup(path)
        raise
    return list(made.values())


def _limit_memory(group: Path, limit: int) -> None:
    """The run's memory, all its processes together, swap excluded: v2 `memory.max` and
    `memory.swap.max`, or v1 `memory.limit_in_bytes` and `memory.memsw.limit_in_bytes` (memory
    plus swap, so equal to the limit means no swap)."""
    if (group / "memory.max").exists():
        (group / "memory.max").write_text(str(limit))
        if (group / "memory.swap.max").exists():
            (group / "memory.swap.max").write_text("0")
        return
    (group / "memory.limit_in_bytes").write_text(str(limit))
    if (group / "memory.memsw.limit_in_bytes").exists():
        (group / "memory.memsw.limit_in_bytes").write_text(str(limit))


def _remove_cgroup(path: str) -> None:
    """Kill whatever is left in the cgroup, then remove it (the kernel needs a moment to reap
    killed processes before rmdir succeeds)."""
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


class _Launch:
    """The command line of one run, where it runs, and what guards it."""

    def __init__(self, iso: Isolation, backend: Backend, limits: SandboxLimits) -> None:
        self.tmp = tempfile.mkdtemp(prefix="conductor-sandbox-")
        self.cgroups: list[str] = []
        self.processes: int | None = None
        config, tools = STATE.config, iso.tools
        if backend == "bwrap":
            self.argv = backends.bwrap_command(tools["bwrap"], limits.scratch_mb)
            self.cwd, home = "/", SANDBOX_DIR
        elif backend == "namespaces":
            self.argv = backends.namespaces_command(tools, iso.root, config.uid, config.gid,
                                                    self.tmp, limits.scratch_mb)
            self.cwd, home = "/", SANDBOX_DIR
        else:
            self.argv = backends.unconfined_command()
            self.cwd = home = self.tmp
        self.env = _env(home)
        self.isolation = _describe(backend, iso, limits)
        if backend != "unconfined" and iso.cgroups:
            self.cgroups = _make_cgroups(iso.cgroups, limits)
            self.argv = [tools.get("sh", "/bin/sh"), "-c", _JOIN_CGROUPS, "sh", *self.cgroups,
                         "--", *self.argv]
        if not iso.root:
            # in a user namespace only the sandbox's processes count; outside one, all the user's
            self.processes = limits.max_processes + (
                _user_thread_count() if backend == "unconfined" else 0)

    def close(self) -> None:
        for path in self.cgroups:
            _remove_cgroup(path)
        shutil.rmtree(self.tmp, ignore_errors=True)


def _user_thread_count() -> int:
    """Threads of this user now: what RLIMIT_NPROC counts outside a user namespace."""
    uid, total = os.getuid(), 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines()
                          if ":" in line)
        except OSError:
            continue
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            total += int(fields.get("Threads", "1"))
    return total


def _describe(backend: Backend, iso: Isolation, limits: SandboxLimits) -> dict[str, str]:
    if backend == "unconfined":
        return {"backend": "unconfined", "network": "audit hook only",
                "filesystem": "the host's, writable", "warning": "not isolated (opted out)"}
    who = f"uid {STATE.config.uid}" if iso.root else "the worker's uid, in a user namespace"
    return {
        "backend": backend, "network": "none (own network namespace)",
        "filesystem": f"read-only runtime, {limits.scratch_mb} MB tmpfs at {SANDBOX_DIR}",
        "user": who, "privileges": "no capabilities, no_new_privs",
        "processes": f"pids cgroup (max {limits.max_processes})",
        "memory": f"memory cgroup ({limits.memory_mb} MB for the whole run, no swap)",
        "syscalls": "seccomp allow-list",
        "cleanup": "pid namespace",
    }


def _read(stdout: bytes, overflow: bool) -> tuple[list[Any], str]:
    """Validated events, and the protocol error that stopped the reading ('' if none)."""
    events: list[Any] = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        try:
            events.append(_EVENT.validate_json(line))
        except ValidationError as exc:
            first = exc.errors()[0]
            return events, f"malformed sandbox output ({first['type']}: {first['msg']})"
    if overflow:
        return events, f"the run wrote more than {STDOUT_CAP >> 20} MB to the result channel"
    return events, ""


def _signal_name(number: int) -> str:
    """SIGKILL, or the number of a signal Python has no name for (real-time ones: 34-64)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _unfinished(timed_out: bool, code: int | None, limits: SandboxLimits) -> str:
    if timed_out:
        return f"timed out after {limits.timeout_s:g}s"
    if code is not None and code < 0:
        return f"killed by signal {_signal_name(-code)}"
    return f"the interpreter exited (code {code}) before the run finished"


class _Assembler:
    """Events into a SandboxResult, checking their order: ready first, each test or case once,
    in order, nothing after done."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.res = SandboxResult()
        self.collected: list[str] | None = None
        self.done = False
        count = len(job.get("cases") or job.get("inputs") or [])
        self.res.calls = [None] * count if job["mode"] == "call" else []
        self.res.io = [None] * count if job["mode"] == "io" else []
        self._next = 0

    def add(self, event: Any) -> str:
        """'' or why this event breaks the protocol."""
        if self.done:
            return "output after the run finished"
        if isinstance(event, Done):
            self.done, self.res.output_tail = True, event.output
        elif isinstance(event, Failed):
            stage = "solution" if event.stage == "solution" else "tests"
            self.res.failure = f"{stage} raised: {event.error}"
        elif isinstance(event, Collected) and self.job["mode"] == "asserts":
            if self.collected is not None or len(set(event.tests)) != len(event.tests):
                return "tests collected twice"
            self.collected = event.tests
        elif isinstance(event, TestEvent) and self.collected is not None:
            if self._next >= len(self.collected) or event.name != self.collected[self._next]:
                return f"unexpected test {event.name!r}"
            self.res.tests.append(Outcome(name=event.name, passed=event.passed, error=event.error))
            self._next += 1
        elif isinstance(event, CallEvent | IoEvent):
            slots: list[Any] = self.res.calls if isinstance(event, CallEvent) else self.res.io
            if event.index != self._next or event.index >= len(slots):
                return f"unexpected case {event.index}"
            slots[event.index] = event
            self._next += 1
        else:
            return f"unexpected {event.event!r} event"
        return ""


def _assemble(job: dict[str, Any], events: list[Any], protocol: str, stderr: bytes,
              code: int | None, timed_out: bool, limits: SandboxLimits) -> SandboxResult:
    if not events or not isinstance(events[0], Ready):
        # Nothing of the candidate's has run before "ready": a sandbox that never got there
        # (it failed, broke the protocol, or was still starting when the time ran out, as on
        # an overloaded host) is our failure, never the candidate's.
        res = SandboxResult(timed_out=timed_out, exit_code=code)
        tail = stderr.decode("utf-8", "replace").strip()[-1500:]
        if timed_out:
            res.error = (f"the sandbox did not start within {limits.timeout_s:g}s (is the host "
                         f"overloaded?): {tail or 'no output'}")
        else:
            why = f"{protocol}; " if protocol else ""
            res.error = f"sandbox failed to start (exit {code}): {why}{tail or 'no output'}"
        return res
    asm = _Assembler(job)
    for event in events[1:]:
        if problem := asm.add(event):
            protocol = protocol or problem
            break
    res = asm.res
    res.timed_out, res.exit_code = timed_out, code
    if asm.collected is not None:
        finished = {t.name for t in res.tests}
        res.tests += [Outcome(name=n, passed=False, error=_unfinished(timed_out, code, limits))
                      for n in asm.collected if n not in finished]
        if not asm.collected and asm.done and not protocol:
            res.tests.append(Outcome(name="tests.py (top-level asserts)", passed=True))
    if protocol:
        res.failure = protocol
        res.tests = [revised(t, passed=False) for t in res.tests]
        res.calls = [None] * len(res.calls)
        res.io = [None] * len(res.io)
    elif not asm.done and not res.failure:
        res.failure = _unfinished(timed_out, code, limits)
    return res


def execute(iso: Isolation, backend: Backend, job: dict[str, Any],
            limits: SandboxLimits, program: bytes | None = None) -> SandboxResult:
    """Run one job under `backend`. Raises OSError when the sandbox cannot be set up.
    `program`: the seccomp filter, the allow-list unless given (the benchmark's baseline)."""
    launch = _Launch(iso, backend, limits)
    try:
        job = {**job, "block_sockets": limits.block_sockets,
               "seccomp": base64.b64encode(program or syscalls.program()).decode(), "limits": {
            "cpu_s": int(limits.timeout_s) + 1, "memory_bytes": limits.memory_mb << 20,
            "file_bytes": limits.max_file_mb << 20, "open_files": limits.open_files,
            "processes": launch.processes,
        }}
        proc = subprocess.Popen(launch.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=launch.cwd, env=launch.env,
                                start_new_session=True)
        out, err = _Capped(proc.stdout, STDOUT_CAP), _Capped(proc.stderr, STDERR_CAP)
        timed_out = False
        try:
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.write(json.dumps(job).encode())
                proc.stdin.close()
            proc.wait(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _stop(proc)
        stdout, stderr = out.join(KILL_GRACE_S), err.join(KILL_GRACE_S)
        events, protocol = _read(stdout, out.overflow)
        res = _assemble(job, events, protocol, stderr, proc.returncode, timed_out, limits)
        res.isolation = launch.isolation
        return res
    finally:
        launch.close()


PROBE_JOB = {"mode": "call", "solution": "def f(x):\n    return x + 1\n",
             "cases": [{"function": "f", "args": [41], "kwargs": {}}]}


def _probe(iso: Isolation, backend: Backend) -> str:
    """'' when `backend` runs a trivial job end to end, else why not."""
    needs = {"bwrap": ["bwrap"], "namespaces": ["unshare", "setpriv"], "unconfined": []}[backend]
    if missing := [t for t in needs if t not in iso.tools]:
        return f"missing {', '.join(missing)}"
    if backend == "bwrap" and iso.root:
        return "not used as root (see backends)"
    if problem := syscalls.available():
        return problem
    if backend != "unconfined" and (problem := cgroup_problem(iso)):
        return problem
    try:
        res = execute(iso, backend, PROBE_JOB, SandboxLimits(timeout_s=30.0))
    except OSError as exc:
        return str(exc)
    call = res.calls[0] if res.calls else None
    if res.error or call is None or call.value != "42":
        return res.error or res.failure or "the probe job gave a wrong answer"
    return ""


def isolation() -> Isolation:
    """The backend in force: the last probe that worked, or a new probe of each candidate.
    `backend` is None (and `problems` says why) when none works; that is not cached."""
    with STATE.lock:
        if STATE.found is not None:
            return STATE.found
        iso = survey()
        for backend in candidates(STATE.config, iso.root):
            if problem := _probe(iso, backend):
                iso.problems[backend] = problem
                continue
            iso.backend = backend
            STATE.found = iso
            break
        return iso
