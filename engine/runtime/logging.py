"""structlog set-up: JSON lines in services, readable lines on a terminal.

Activities bind workflow id, run id, step index and agent to every line they log, so one grep
follows a run across processes. Keys are never logged: only the NAME of their variable.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

from conductor_engine.engine.redaction import redact_text


def _redacted(_logger: object, _method: str, event: MutableMapping[str, Any]
              ) -> MutableMapping[str, Any]:
    """Every text value of a line through `redact_text`: a logged error may quote a URL with a
    password in it or a server that echoed a key."""
    for k, v in event.items():
        if isinstance(v, str):
            event[k] = redact_text(v)
        elif isinstance(v, BaseException):
            event[k] = redact_text(f"{type(v).__name__}: {v}")
    return event


def configure_logging(fmt: str = "auto", level: str = "warning") -> None:
    json_lines = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if json_lines
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.WARNING)
    logging.basicConfig(level=numeric, stream=sys.stderr, format="%(message)s")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            _redacted,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
