"""How `conductor serve` holds against slow and hostile clients, below the app: uvicorn's h11
protocol with its own bound on a request's head, and a small subclass for what uvicorn lacks.

- **Head size.** h11 buffers at most `max_header_bytes` of an unfinished request line and
  headers (its `max_incomplete_event_size`); past it the client gets a 431 and the connection
  closes, so one endless header costs at most that much memory. The protocol is pinned to h11
  (uvicorn would pick httptools where installed, which has no such bound). A head with more than
  `max_headers` fields is a 431 too.
- **Body chunks.** A chunked request body may come in at most MAX_BODY_CHUNKS chunks (413, and
  closed): h11 hands each chunk to Python, so one-byte chunks cost the event loop seconds.
- **Head timeout.** A connection has `header_timeout_s` to send a whole request head, from when
  it opens or its previous answer ends; then it is closed. uvicorn only times out a connection
  that sends nothing after an answer (`timeout_keep_alive`); one byte restarts its wait.
- **Connection cap.** At most `max_connections` connections are held. A connection past the cap
  displaces the one that has waited longest without a request in flight (a half-sent or idle
  one costs its client nothing to open, so such connections cannot hold the slots against
  others); when every connection has a request in flight, the newcomer's request is answered
  503 with Retry-After. The cap stays under the open-file limit (`connection_cap`), so accepting
  never runs out of descriptors because of clients.
- **Quiet logs.** A failed accept, and uvicorn's warning about each malformed request, is logged
  once a minute at most (`quiet_noisy_logs`), with the count of those left out.

The bounds are settings (`serve_*` in engine/settings.py; docs/how-to/serving.md).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Callable
from typing import Any, ClassVar

import h11
import uvicorn
from pydantic import BaseModel, ConfigDict
from starlette.responses import JSONResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

from conductor_engine.engine.contracts.limits import size_label
from conductor_engine.engine.settings import Settings
from conductor_engine.runtime.serve.wire import ErrorType, error_body

RETRY_AFTER_S = 5
"""What a 503 for a full server says to wait (`Retry-After`, seconds)."""

MAX_BODY_CHUNKS = 4096
"""The most pieces a chunked request body may come in (8 MiB at most in all, so 2 KiB a piece
on average). Each piece is a Python event on the event loop; a body of one-byte chunks, keyed
or not (one nobody reads is still parsed to be thrown away), took seconds of it."""

FD_RESERVE = 256
"""Open files kept for the server's own use (Temporal, PostgreSQL, the in-process worker's
agent calls and sandboxes) when the connection cap is fitted under the open-file limit."""

ACCEPT_BACKLOG = 64
"""The listening socket's backlog, which is also how many connections asyncio accepts each time
the socket is ready, before any of them is counted against the cap (uvicorn's default, 2,048,
let a burst of 1,100 half-sent requests open more files than the cap and FD_RESERVE left:
accept failed with 'Too many open files' in one whole run of the test suite). A burst and the
next can both be accepted before the first is counted: 2 x 64 leaves most of FD_RESERVE."""


class ServeLimits(BaseModel):
    """The bounds on clients, from the `serve_*` settings (each documented there)."""

    model_config = ConfigDict(frozen=True)

    max_connections: int
    header_timeout_s: float
    max_header_bytes: int
    max_headers: int
    body_timeout_s: float

    @classmethod
    def of(cls, settings: Settings) -> ServeLimits:
        return cls(max_connections=settings.serve_max_connections,
                   header_timeout_s=settings.serve_header_timeout,
                   max_header_bytes=settings.serve_max_header_bytes,
                   max_headers=settings.serve_max_headers,
                   body_timeout_s=settings.serve_body_timeout)


def connection_cap(wanted: int) -> tuple[int, str | None]:
    """The connection cap to use, and a note when it is less than `wanted`: the open-file soft
    limit is raised to the hard one first (as servers do), and the cap kept FD_RESERVE under it,
    since every connection is an open file and a process out of them cannot accept anyone."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < target:
        new = target if hard == resource.RLIM_INFINITY else min(target, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= target:
        return wanted, None
    cap = max(1, soft - FD_RESERVE)
    return cap, (f"holding at most {cap} connections, not {wanted}: this process may open "
                 f"{soft} files; raise the limit (`ulimit -n`) for more")


def _answer(status: int, message: str, code: str, headers: dict[str, str] | None = None,
            ) -> JSONResponse:
    kind: ErrorType = "server_error" if status >= 500 else "invalid_request_error"
    return JSONResponse(error_body(message, kind, code), status_code=status,
                        headers={"connection": "close", **(headers or {})})


def _head_too_large(limit: int) -> str:
    return (f"the request's line and headers are over {size_label(limit)}: send fewer or "
            "shorter headers")


def _head_bytes(scope: Any) -> int:
    """About how many bytes the request's line and headers took (h11 only bounds a head that
    arrives in pieces; one that arrives whole in a single read is checked here)."""
    line = len(scope["raw_path"]) + len(scope["query_string"]) + 16
    return line + sum(len(name) + len(value) + 4 for name, value in scope["headers"])


class _CountingConnection(h11.Connection):
    """h11's connection, which refuses a request body in more than MAX_BODY_CHUNKS chunks."""

    def __init__(self, max_incomplete_event_size: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size)
        self.chunks = 0

    def next_event(self) -> Any:
        event = super().next_event()
        if isinstance(event, h11.Data) and event.chunk_start:
            self.chunks += 1
            if self.chunks > MAX_BODY_CHUNKS:
                raise h11.RemoteProtocolError("too many body chunks", error_status_hint=413)
        elif isinstance(event, h11.Request):
            self.chunks = 0
        return event


class _Guard:
    """One server's shared state: its connections without a request in flight, oldest first."""

    def __init__(self, limits: ServeLimits) -> None:
        self.limits = limits
        self.waiting: dict[GuardedH11Protocol, None] = {}
        self.held = 0


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the head timeout, the head-field count and the connection
    cap (module docstring). Made per server by `guarded_protocol`."""

    guard: ClassVar[_Guard]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = _CountingConnection(self.guard.limits.max_header_bytes)
        self._inner = self.app
        self.app = self._guarded
        self._timer: asyncio.TimerHandle | None = None
        self._held = False
        self._full = False

    # --- the connection's life ------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[arg-type]
        guard = self.guard
        guard.held += 1
        self._held = True
        if guard.held > guard.limits.max_connections:
            oldest = next(iter(guard.waiting), None)
            if oldest is not None:
                oldest._release()
                oldest.transport.close()
            else:  # every connection has a request in flight: this one's gets a 503
                self._full = True
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()
        super().connection_lost(exc)

    def _release(self) -> None:
        """This connection stops counting (closed, or about to be)."""
        self._stop_waiting()
        if self._held:
            self._held = False
            self.guard.held -= 1

    def _await_head(self) -> None:
        """Start the wait for a request head: the connection is evictable, and timed."""
        self._stop_waiting()
        self.guard.waiting[self] = None
        self._timer = self.loop.call_later(self.guard.limits.header_timeout_s,
                                           self._head_timed_out)

    def _stop_waiting(self) -> None:
        self.guard.waiting.pop(self, None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_timed_out(self) -> None:
        self._timer = None
        self._release()
        if not self.transport.is_closing():
            self.transport.close()

    # --- h11 events -----------------------------------------------------------------------
    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()
        if self.cycle is not before:  # a request head arrived: a request is in flight
            self._stop_waiting()

    def on_response_complete(self) -> None:
        if not self.transport.is_closing():
            self._await_head()  # before uvicorn reads a pipelined request (which stops it)
        super().on_response_complete()

    def send_400_response(self, msg: str) -> None:
        """h11 refused the request: a 431 for the head's size, a 413 for a body in too many
        chunks (just closed if the answer has begun), else uvicorn's 400."""
        limit = self.guard.limits.max_header_bytes
        if self.cycle is not None and self.cycle.response_started:
            self.transport.close()
            return
        if len(self.conn.trailing_data[0]) > limit:
            status, reason, text = 431, b"Request Header Fields Too Large", _head_too_large(limit)
        elif isinstance(self.conn, _CountingConnection) and self.conn.chunks > MAX_BODY_CHUNKS:
            status, reason = 413, b"Content Too Large"
            text = (f"the request body came in over {MAX_BODY_CHUNKS:,} chunks: send it in "
                    "fewer, larger ones, or whole with a Content-Length")
        else:
            super().send_400_response(msg)
            return
        body = text.encode()
        head = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close"),
                (b"content-length", str(len(body)).encode())]
        for event in (h11.Response(status_code=status, headers=head, reason=reason),
                      h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))  # type: ignore[arg-type]
        self.transport.close()

    async def _guarded(self, scope: Any, receive: Any, send: Any) -> None:
        """The app, after the checks that need the parsed head."""
        limits = self.guard.limits
        if self._full:
            response = _answer(503, "the server is at its connection limit with every "
                               f"connection busy: retry in {RETRY_AFTER_S}s", "server_busy",
                               {"retry-after": str(RETRY_AFTER_S)})
        elif len(scope["headers"]) > limits.max_headers:
            response = _answer(431, f"the request has {len(scope['headers'])} header fields, "
                               f"over the {limits.max_headers} this server reads: send fewer",
                               "too_many_headers")
        elif _head_bytes(scope) > limits.max_header_bytes:
            response = _answer(431, _head_too_large(limits.max_header_bytes), "head_too_large")
        else:
            await self._inner(scope, receive, send)
            return
        await response(scope, receive, send)


def guarded_protocol(limits: ServeLimits) -> type[GuardedH11Protocol]:
    """The protocol class for one server (its own connection count and waiting list)."""
    return type("ServeH11Protocol", (GuardedH11Protocol,), {"guard": _Guard(limits)})


def uvicorn_config(app: Any, limits: ServeLimits, **options: Any) -> uvicorn.Config:
    """uvicorn's Config for `app` under `limits` (the other options as uvicorn takes them; the
    backlog ACCEPT_BACKLOG unless given)."""
    options.setdefault("backlog", ACCEPT_BACKLOG)
    return uvicorn.Config(app, http=guarded_protocol(limits), ws="none",
                          h11_max_incomplete_event_size=limits.max_header_bytes, **options)


class OncePerPeriod(logging.Filter):
    """Lets a noisy record through once per `period_s` for each first line of its message; the
    next one let through says how many were left out. Other records pass untouched."""

    def __init__(self, noisy: Callable[[logging.LogRecord], bool], period_s: float = 60.0
                 ) -> None:
        super().__init__()
        self.noisy, self.period_s = noisy, period_s
        self._seen: dict[str, tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.noisy(record):
            return True
        key = record.getMessage().partition("\n")[0][:200]
        now = time.monotonic()
        last, left_out = self._seen.get(key, (float("-inf"), 0))
        if now - last < self.period_s:
            self._seen[key] = (last, left_out + 1)
            return False
        self._seen[key] = (now, 0)
        if left_out:
            record.msg = (f"{record.getMessage()} ({left_out} more like it in the last "
                          f"{self.period_s:g}s not logged)")
            record.args = ()
        return True


ACCEPT_FAILED = "socket.accept() out of system resource"
"""What asyncio logs (with a traceback) each time accepting a connection fails for want of
open files or memory: about once a second while it lasts."""


def quiet_noisy_logs(period_s: float = 60.0) -> None:
    """Log failed accepts, and uvicorn's warnings about each bad request or full server, once
    per `period_s` at most each: a client must not be able to fill the server's log."""
    logging.getLogger("asyncio").addFilter(OncePerPeriod(
        lambda r: r.getMessage().startswith(ACCEPT_FAILED), period_s))
    logging.getLogger("uvicorn.error").addFilter(OncePerPeriod(
        lambda r: r.levelno == logging.WARNING, period_s))
