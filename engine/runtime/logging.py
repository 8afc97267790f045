"""structlog set-up: JSON lines in services, readable lines on a terminal.

Activities bind workflow id, run id, step index and agent to every line they log, so one grep
follows a run across processes. Keys are never logged: only the NAME of their variable.

Two kinds of line reach stderr: the engine's own (structlog) and those of libraries that log
through the standard library (the Temporal SDK's `temporalio.*` loggers: a failed activity
attempt, a workflow task that failed, a worker shutting down; asyncpg, httpx, ...). Both go
through the same processors, so in JSON mode every line is one JSON object with `level`,
`timestamp` and `event` (a library line also `logger`, its `extra` fields such as the SDK's
`temporal_activity`, and `exception` when it has one), and every line is redacted.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

from conductor_engine.engine.redaction import redact_text

_handler: logging.Handler | None = None  # ours on the root logger, replaced on reconfiguration
_json_stream: TextIO | None = None  # where JSON lines go, in JSON mode


def _redact(value: Any) -> Any:
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, BaseException):
        return redact_text(f"{type(value).__name__}: {value}")
    if isinstance(value, dict):
        return {k: _redact(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact(v) for v in value]
    return value


def _redacted(_logger: object, _method: str, event: MutableMapping[str, Any]
              ) -> MutableMapping[str, Any]:
    """Every text value of a line through `redact_text` (within the dicts and lists a library's
    `extra` brings too): a logged error may quote a URL with a password in it or a server that
    echoed a key."""
    for k, v in event.items():
        event[k] = _redact(v)
    return event


def configure_logging(fmt: str = "auto", level: str = "warning",
                      stream: TextIO | None = None) -> None:
    """Set up both kinds of line for this process (again, when called again), on `stream`
    (stderr by default)."""
    global _handler, _json_stream
    stream = stream or sys.stderr
    json_lines = fmt == "json" or (fmt == "auto" and not stream.isatty())
    _json_stream = stream if json_lines else None
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if json_lines
        else structlog.dev.ConsoleRenderer(colors=stream.isatty())
    )
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.WARNING)
    stamp = structlog.processors.TimeStamper(fmt="iso")
    # a traceback as a string field in JSON; the console renderer prints its own, prettier
    exc: list[structlog.typing.Processor] = (
        [structlog.processors.format_exc_info] if json_lines else [])
    # the standard library's records: the same fields and renderer as structlog's own lines
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.stdlib.ExtraAdder(),
            stamp,
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            *exc,
            _redacted,
            renderer,
        ],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    root.addHandler(handler)
    root.setLevel(numeric)
    _handler = handler
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            stamp,
            *exc,
            _redacted,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )


def announce_json(event: str, **fields: Any) -> bool:
    """In JSON mode, write a line a service always writes, whatever the level (a worker that
    starts polling, or stops) as a JSON line of level `info`, and say True; on a terminal say
    False, and the caller prints it its own way. So a service's stderr holds only JSON lines."""
    if _json_stream is None:
        return False
    line = {"event": event, **fields, "level": "info"}
    structlog.processors.TimeStamper(fmt="iso")(None, "info", line)
    _json_stream.write(json.dumps(_redacted(None, "info", line), default=str) + "\n")
    _json_stream.flush()
    return True
