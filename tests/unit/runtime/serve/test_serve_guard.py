"""The rate limit on `conductor serve`'s noisy log lines (runtime/serve/guard.py); the
guard's bounds on clients are tested against the real server in
tests/integration/test_serve_guard.py."""

from __future__ import annotations

import logging
import time

from conductor_engine.runtime.serve.guard import OncePerPeriod


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_noisy_line_passes_once_a_period_then_says_how_many_were_left_out() -> None:
    logger = logging.getLogger("tests.serve.noisy")
    logger.propagate = False
    kept = _Kept()
    logger.addHandler(kept)
    logger.addFilter(OncePerPeriod(lambda r: r.levelno == logging.WARNING, period_s=1.0))
    for _ in range(50):
        logger.warning("Invalid HTTP request received.")
    logger.warning("Exceeded concurrency limit.")  # another line has its own period
    logger.error("Exception in ASGI application")  # not noisy: every one passes
    logger.error("Exception in ASGI application")
    time.sleep(1.05)
    logger.warning("Invalid HTTP request received.")
    assert kept.lines == [
        "Invalid HTTP request received.", "Exceeded concurrency limit.",
        "Exception in ASGI application", "Exception in ASGI application",
        "Invalid HTTP request received. (49 more like it in the last 1s not logged)"]


def test_the_accept_burst_fits_in_the_files_kept_beyond_the_connection_cap() -> None:
    """asyncio accepts up to the backlog's number of connections each time the listening socket
    is ready, before any is counted against the cap: with uvicorn's 2,048 a burst of half-sent
    requests ran the served process out of files. The server listens with ACCEPT_BACKLOG, and
    two bursts fit in FD_RESERVE; a backlog given explicitly is kept."""
    from conductor_engine.runtime.serve.guard import (
        ACCEPT_BACKLOG,
        FD_RESERVE,
        ServeLimits,
        uvicorn_config,
    )

    limits = ServeLimits(max_connections=10, header_timeout_s=5, max_header_bytes=8192,
                         max_headers=64, body_timeout_s=5)
    assert uvicorn_config(object(), limits).backlog == ACCEPT_BACKLOG
    assert 2 * ACCEPT_BACKLOG <= FD_RESERVE // 2
    assert uvicorn_config(object(), limits, backlog=16).backlog == 16
