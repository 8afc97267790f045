"""Symbolic answer checking with math-verify, safe to call from any thread.

math-verify bounds its work with signal.alarm, which only a main thread may use; the score
activity runs verifiers in worker threads. Measured options: running math-verify in the calling
thread with its timeouts off is fast (1-100 ms a check) but an answer such as `10^{10^{10}}`
then hangs the thread for good; a fresh process per check is safe but costs ~0.5 s (importing
sympy). So checks go to a small pool of long-lived helper processes (`_math_worker.py`): each
imports math-verify once, runs it in its own main thread with its own timeouts, under a memory
limit, and is killed and replaced if it fails to answer in time. A check then costs about a
millisecond more than in-process; the first one in a process pays the helper's start-up.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

WORKER = Path(__file__).with_name("_math_worker.py")
STARTUP_TIMEOUT_S = 60.0
MAX_IDLE_WORKERS = 4


class MathCheckError(Exception):
    """The helper process failed before it reached the candidate's answer (start-up, the
    reference, a crash or a kill from outside): a verifier error."""


class _HelperGone(MathCheckError):
    """The helper was already dead when a request was written to it (an idle helper killed
    from outside): nothing of the request was read, so another helper may take it."""


class _AnswerGaveUp(Exception):
    """The helper timed out or died while reading the candidate's answer: the answer's fault."""


class _Worker:
    """One helper process, used by one thread at a time."""

    def __init__(self) -> None:
        self.killed_by_us = False
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-B", str(WORKER)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env={"LANG": "C.UTF-8", "PATH": os.defpath}, start_new_session=True,
        )
        self._buffer = b""
        ready = self._read(STARTUP_TIMEOUT_S)
        if not ready.get("ready"):
            self.kill()
            raise MathCheckError(f"math helper failed to start: {ready.get('error', ready)}")

    def _read(self, timeout_s: float) -> dict[str, Any]:
        """The helper's next line, read from the pipe itself (a buffered reader could hold a
        second line that `select` would then wait for in vain)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            readable, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not readable:
                self.kill()
                raise MathCheckError(f"math check timed out after {timeout_s:g}s")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.kill()
                raise MathCheckError(f"math helper exited (code {self.proc.returncode})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        reply: dict[str, Any] = json.loads(line)
        return reply

    def ask(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """The helper's reply. Once it says it has begun on the answer (a `stage` line), its
        timing out or dying is the answer's doing (`_AnswerGaveUp`), unless something outside
        killed it (SIGKILL that was not ours: the host out of memory)."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError as exc:
            self.kill()
            raise _HelperGone(f"math helper is gone: {exc}") from exc
        reply = self._read(timeout_s)
        if reply.get("stage") != "answer":
            return reply
        try:
            return self._read(timeout_s)
        except MathCheckError as exc:
            if self.killed_by_us or self.proc.returncode != -signal.SIGKILL:
                raise _AnswerGaveUp(str(exc)) from exc
            raise

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.killed_by_us = True
            self.proc.kill()
        self.proc.wait()


class _Pool:
    """Idle helpers, handed to one caller at a time; a helper that failed is never returned."""

    def __init__(self) -> None:
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()

    def _take(self) -> _Worker | None:
        """An idle helper that is still alive (one that died while idle is reaped), or None."""
        while True:
            with self._lock:
                worker = self._idle.pop() if self._idle else None
            if worker is None or worker.proc.poll() is None:
                return worker
            worker.kill()

    def check(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        worker = self._take()
        if worker is not None:
            try:
                reply = worker.ask(request, timeout_s)
            except _HelperGone:  # it died between the look and the write: nothing was read
                worker = None
        if worker is None:
            worker = _Worker()
            reply = worker.ask(request, timeout_s)  # on failure the worker is killed and dropped
        with self._lock:
            if len(self._idle) < MAX_IDLE_WORKERS:
                self._idle.append(worker)
                return reply
        worker.kill()
        return reply

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()


_pool = _Pool()
atexit.register(_pool.close)


def check_math(gold: str, answer: str, timeout_s: float,
               others: list[str] | None = None) -> dict[str, Any]:
    """Compare `answer`, then each of `others` (the reply's other stated answers), with the
    reference `gold` by math-verify. Returns the helper's reply: `ok`, `correct`, the parsed
    `gold` and `answer`, `hedge` (the first other answer that differs), `failure` (why
    math-verify gave up on the candidate's text: then `correct` is False), `gold_unparsed`, or
    `error`. Raises MathCheckError if the helper fails before it reaches the answer."""
    request = {"gold": gold, "answer": answer, "others": others or [],
               "timeout": max(1, int(timeout_s / 3))}
    try:
        return _pool.check(request, timeout_s + 1.0)
    except _AnswerGaveUp as exc:
        return {"ok": True, "correct": False, "gold": [], "answer": [], "hedge": None,
                "failure": f"math-verify gave up on the answer ({exc})"}
