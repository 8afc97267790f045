"""Runs inside the code sandbox: imports a candidate solution, runs the task's tests against it and
reports each outcome as one JSON line on a private copy of stdout.

This file is executed by path with `python -I`, so it imports nothing but the standard library.
Everything before the candidate's code runs here is trusted: it caps the process's resources
(soft = hard, and the sandbox has dropped the capabilities that could raise them again) and, when
asked, installs an audit hook that refuses network use. Results are streamed one test at a time
so that a run cut off by its timeout still reports the tests that finished.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import resource
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from typing import Any

SOLUTION_MODULE = "solution"
TESTS_FILE = "tests.py"
OUTPUT_FILE = "output.txt"
OUTPUT_TAIL = 2000

_NETWORK_EVENTS = {
    "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
    "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
    "socket.getnameinfo",
}


def _deny_network(event: str, args: tuple[Any, ...]) -> None:
    """Audit hook: no sockets but local socket pairs (asyncio's event loop needs one)."""
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


def _describe(exc: BaseException) -> str:
    """The exception and the candidate's own frames (not the runner's or importlib's), short
    enough for a trace."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames[:-1] if f.filename in (TESTS_FILE, _solution_path())]
    shown = [*own[-3:], *frames[-1:]]
    text = "".join(traceback.format_list(shown) + traceback.format_exception_only(exc))
    return text.strip()[-1500:]


def _solution_path() -> str:
    return os.path.join(os.getcwd(), f"{SOLUTION_MODULE}.py")


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
    except BaseException as exc:  # a test may raise anything, SystemExit included
        return _describe(exc)
    return None


def run(job: dict[str, Any], report: Reporter) -> None:
    with open(f"{SOLUTION_MODULE}.py", "w", encoding="utf-8") as f:
        f.write(job["solution"])
    sys.path.insert(0, os.getcwd())
    report.emit("ready")
    try:
        module = importlib.import_module(SOLUTION_MODULE)
    except BaseException as exc:
        report.emit("failed", stage="solution", error=_describe(exc))
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


def main() -> None:
    job = json.loads(sys.stdin.read())
    report = Reporter()
    _capture_output()
    _apply_limits(job["limits"])
    if job.get("block_sockets", True):
        sys.addaudithook(_deny_network)
    try:
        run(job, report)
    finally:
        report.emit("done", output=_output_tail())


if __name__ == "__main__":
    main()
