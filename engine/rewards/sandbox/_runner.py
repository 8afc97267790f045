"""Runs inside the code sandbox, started by path with `python -I -S -B`: the standard library
only (no site-packages on sys.path, for the runner or the candidate).

It reads one job (JSON on stdin), leaves the session of the sandbox's own processes (a candidate
signalling its process group, or -1, reaches nothing but the run), makes itself undumpable (no
ptrace, no /proc/PID/mem of the runner from a candidate's child), loads the seccomp allow-list
the worker compiled (`syscalls.py`; failing that, it exits before the candidate exists), caps its
own resources (soft = hard; the sandbox has dropped the capabilities that could raise them
again), optionally installs an audit hook that refuses network use, and reports what happened as
JSON lines on a private copy of stdout.

It never sees an expected value. It runs the candidate and reports what the candidate *did*:
- `io`: each case's stdin fed to the candidate program run as `__main__` in a process of its
  own; its stdout is reported. The candidate never runs in this process.
- `call`: the candidate imported as the module `solution`; each case's arguments passed to the
  named function (or `Class.method` on a fresh instance); the return value reported as JSON.
- `asserts`: the task's own test code run beside the candidate (each `test*` function is one
  test, or the top-level asserts are one). The outcome is reported from inside the candidate's
  own process, so the candidate can forge it: the parent marks such verdicts untrusted.
The trusted parent compares, validates every line strictly, and decides.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import ctypes
import importlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import traceback
from collections.abc import Callable
from typing import Any

SOLUTION_MODULE = "solution"
TESTS_FILE = "tests.py"
OUTPUT_FILE = "output.txt"
OUTPUT_TAIL = 2000
ERROR_CHARS = 1500

PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS, SECCOMP_MODE_FILTER = 4, 22, 38, 2
_NETWORK_EVENTS = {
    "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
    "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
    "socket.getnameinfo",
}


def _deny_network(event: str, args: tuple[Any, ...]) -> None:
    """Audit hook: no sockets but local socket pairs (asyncio's event loop needs one). Defence in
    depth and a clear message: the network namespace is what actually holds."""
    if event == "socket.__new__" and args[1] != socket.AF_UNIX:
        raise PermissionError("network access is disabled in the code sandbox")
    if event in _NETWORK_EVENTS:
        raise PermissionError("network access is disabled in the code sandbox")


def _limit(kind: int, value: int | None) -> None:
    if value is not None:
        resource.setrlimit(kind, (value, value))


def _apply_limits(limits: dict[str, int | None]) -> None:
    _limit(resource.RLIMIT_CPU, limits.get("cpu_s"))
    _limit(resource.RLIMIT_AS, limits.get("memory_bytes"))
    _limit(resource.RLIMIT_FSIZE, limits.get("file_bytes"))
    _limit(resource.RLIMIT_NPROC, limits.get("processes"))
    _limit(resource.RLIMIT_NOFILE, limits.get("open_files"))
    _limit(resource.RLIMIT_CORE, 0)
    # Past the file-size limit a write fails with an error instead of killing the process.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _confine(program: bytes) -> None:
    """Own session, undumpable, then the seccomp filter (raises, before any candidate code, if
    the kernel refuses it). The filter holds for every process started after it."""
    with contextlib.suppress(OSError):  # already a session leader (unconfined): nothing above
        os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(buffer))
    for option, args in ((PR_SET_DUMPABLE, (0, 0, 0, 0)), (PR_SET_NO_NEW_PRIVS, (1, 0, 0, 0)),
                         (PR_SET_SECCOMP, (SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0))):
        if libc.prctl(option, *args) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl({option}) failed: {os.strerror(err)}")


def _solution_path() -> str:
    return os.path.join(os.getcwd(), f"{SOLUTION_MODULE}.py")


def _describe(exc: BaseException) -> str:
    """The exception and the candidate's own frames (not the runner's), short enough for a
    trace."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames[:-1] if f.filename in (TESTS_FILE, _solution_path())]
    shown = [*own[-3:], *frames[-1:]]
    text = "".join(traceback.format_list(shown) + traceback.format_exception_only(exc))
    return text.strip()[-ERROR_CHARS:]


class Reporter:
    """Writes result events to the stdout the sandbox was started with."""

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")

    def emit(self, event: str, **data: Any) -> None:
        self._out.write(json.dumps({"event": event, **data}) + "\n")
        self._out.flush()


def _capture_output() -> None:
    """Send the candidate's stdin/stdout/stderr away from the result channel."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    out = os.open(OUTPUT_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)


def _output_tail() -> str:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    try:
        with open(OUTPUT_FILE, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - OUTPUT_TAIL))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _import_solution(source: str, report: Reporter) -> Any | None:
    with open(f"{SOLUTION_MODULE}.py", "w", encoding="utf-8") as f:
        f.write(source)
    sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(SOLUTION_MODULE)
    except BaseException as exc:  # the candidate may raise anything, SystemExit included
        report.emit("failed", stage="solution", error=_describe(exc))
        return None


# --- asserts (forgeable: reported from inside the candidate's process) --------------------


def _collect(namespace: dict[str, Any]) -> list[str]:
    """The test functions the tests file defines itself, in the order it defines them."""
    return [
        name for name, value in namespace.items()
        if name.startswith("test") and callable(value)
        and getattr(getattr(value, "__code__", None), "co_filename", None) == TESTS_FILE
    ]


def _run_one(test: Callable[[], Any]) -> str | None:
    try:
        test()
    except BaseException as exc:
        return _describe(exc)
    return None


def run_asserts(job: dict[str, Any], report: Reporter) -> None:
    module = _import_solution(job["solution"], report)
    if module is None:
        return
    namespace = dict(vars(module))
    namespace["__name__"] = "tests"
    try:
        exec(compile(job["tests"], TESTS_FILE, "exec"), namespace)
    except BaseException as exc:
        report.emit("failed", stage="tests", error=_describe(exc))
        return
    names = _collect(namespace)
    report.emit("collected", tests=names)
    for name in names:
        error = _run_one(namespace[name])
        report.emit("test", name=name, passed=error is None, error=error or "")


# --- call: arguments in, a JSON value out ------------------------------------------------


def _target(module: Any, function: str) -> Callable[..., Any]:
    """`name` (a module-level function) or `Class.method` (called on a fresh instance, the
    LeetCode form)."""
    owner, _, method = function.rpartition(".")
    if owner:
        return getattr(getattr(module, owner)(), method)  # type: ignore[no-any-return]
    return getattr(module, function)  # type: ignore[no-any-return]


def run_call(job: dict[str, Any], report: Reporter) -> None:
    module = _import_solution(job["solution"], report)
    if module is None:
        return
    for index, case in enumerate(job["cases"]):
        args, kwargs = copy.deepcopy(case["args"]), copy.deepcopy(case["kwargs"])
        try:
            value = _target(module, case["function"])(*args, **kwargs)
            text = json.dumps(value)
        except BaseException as exc:
            report.emit("call", index=index, value=None, error=_describe(exc))
            continue
        report.emit("call", index=index, value=text, error=None)


# --- io: stdin in, stdout out, the candidate in a process of its own ---------------------


def _read_capped(path: str, cap: int) -> tuple[str, bool]:
    with open(path, "rb") as f:
        data = f.read(cap + 1)
    return data[:cap].decode("utf-8", "replace"), len(data) > cap


def run_io(job: dict[str, Any], report: Reporter) -> None:
    with open(f"{SOLUTION_MODULE}.py", "w", encoding="utf-8") as f:
        f.write(job["solution"])
    cap, timeout = job["output_cap"], job["case_timeout_s"]
    for index, stdin in enumerate(job["inputs"]):
        with open("stdin.txt", "w", encoding="utf-8") as f:
            f.write(stdin)
        with open("stdin.txt", "rb") as inp, open("stdout.txt", "wb") as out, \
                open("stderr.txt", "wb") as err:
            proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", f"{SOLUTION_MODULE}.py"],
                                    stdin=inp, stdout=out, stderr=err, start_new_session=True)
            timed_out = False
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                code = proc.wait()
        stdout, truncated = _read_capped("stdout.txt", cap)
        stderr, _ = _read_capped("stderr.txt", ERROR_CHARS)
        report.emit("io", index=index, stdout=stdout, truncated=truncated, exit_code=code,
                    timed_out=timed_out, stderr=stderr)


MODES = {"asserts": run_asserts, "call": run_call, "io": run_io}


def main() -> None:
    job = json.loads(sys.stdin.read())
    _confine(base64.b64decode(job["seccomp"]))
    report = Reporter()
    _capture_output()
    _apply_limits(job["limits"])
    if job.get("block_sockets", True):
        sys.addaudithook(_deny_network)
    report.emit("ready")
    try:
        MODES[job["mode"]](job, report)
    finally:
        report.emit("done", output=_output_tail())


if __name__ == "__main__":
    main()
