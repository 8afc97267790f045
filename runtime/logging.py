"""structlog set-up: readable lines by default (a terminal or a pipe), JSON lines when asked.

Activities bind workflow id, run id, step index and agent to every line they log, so one grep
follows a run across processes. Keys are never logged: only the NAME of their variable.

Two kinds of line reach stderr: the engine's own (structlog) and those of libraries that log
through the standard library (the Temporal SDK's `temporalio.*` loggers: a failed activity
attempt, a workflow task that failed, a worker shutting down; asyncpg, httpx, ...). Both go
through the same processors and the one handler on the root logger, so every line is redacted,
and printed once.

- `console` (and `auto`, the default): structlog's ConsoleRenderer, coloured on a terminal
  only. Quiet: a line that carries an exception shows it as one `error='Type: message'` field
  (the engine's errors say what to do) and the SDK's context as a few fields; the traceback
  (never with local variables) only when asked: `tracebacks=True` (the CLI's `--verbose`, or
  the level `debug`).
- `json`: one JSON object a line with `level`, `timestamp` and `event` (a library line also
  `logger`, its `extra` fields such as the SDK's `temporal_activity`, and `exception`, the
  traceback as text: a service's log is where one looks for it).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

from conductor_engine.engine.providers.base import AgentCallError
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


_SDK_CONTEXT = ("temporal_activity", "temporal_workflow")
_SDK_FIELDS = ("activity_type", "workflow_type", "workflow_id", "attempt")
"""What a quiet line keeps of the SDK's context dict (the rest: --verbose or JSON)."""
_SDK_SUFFIX = re.compile(r" \(\{.*\}\)$", re.DOTALL)
"""The SDK's logger adapters append their context dict to the message as well: ` ({...})`."""


def _exception_line(exc: Any) -> str | None:
    """`Type: message` (its first line) of a line's exception, or None if it has none."""
    if exc is True:
        exc = sys.exc_info()
    if isinstance(exc, tuple):
        exc = exc[1]
    if not isinstance(exc, BaseException):
        return None
    message = str(exc).strip().splitlines()
    return type(exc).__name__ + (f": {message[0]}" if message else "")


def _quiet(_logger: object, _method: str, event: MutableMapping[str, Any]
           ) -> MutableMapping[str, Any]:
    """A human line without a traceback: the exception as one `error` field (the engine's
    errors end with what to do), the SDK's context dict cut to a few fields, its private keys
    dropped. So one failed activity attempt is one line."""
    error = _exception_line(event.pop("exc_info", None) or event.pop("exception", None))
    if error is not None:
        event.setdefault("error", error)
    if event.get("message") == event.get("event"):  # a record another handler formatted first
        del event["message"]
    for key in _SDK_CONTEXT:
        context = event.pop(key, None)
        if isinstance(context, dict):
            event["event"] = _SDK_SUFFIX.sub("", str(event.get("event", "")))
            for name in _SDK_FIELDS:
                if name in context:
                    event.setdefault(name, context[name])
    for key in [k for k in event if k.startswith("__")]:
        del event[key]
    return event


def _logged_already(record: logging.LogRecord) -> bool:
    """False for the SDK's `Completing activity as failed` line of a model call that failed:
    the activity (activities/agent.py, plan.py) logged that failure already, with its step,
    agent and what to do, so a quiet log says it once. Kept with tracebacks on."""
    exc = record.exc_info[1] if record.exc_info else None
    return not (record.name.startswith("temporalio") and exc is not None
                and isinstance(exc.__cause__, AgentCallError))


ADOPTED = ("huggingface_hub", "datasets")
"""Libraries that put a stderr handler of their own on their root logger and still propagate
to the root one: each of their lines (a Hugging Face download's `Retrying in 1s`) printed twice,
once bare and once through ours. Their handler is refused, so ours prints them once."""


class _Adopted(logging.Logger):
    """A library root logger whose own bare stderr handler is refused (see ADOPTED)."""

    def addHandler(self, hdlr: logging.Handler) -> None:  # noqa: N802 (logging's name)
        if type(hdlr) is not logging.StreamHandler:
            super().addHandler(hdlr)


def _adopt_library_loggers() -> None:
    """Make the ADOPTED libraries' lines go through our handler only, whether the library is
    imported already (its handler removed) or later (its logger made an _Adopted now, so the
    handler it adds on import is refused)."""
    for name in ADOPTED:
        existing = logging.Logger.manager.loggerDict.get(name)
        if isinstance(existing, logging.Logger):
            for h in [h for h in existing.handlers if type(h) is logging.StreamHandler]:
                existing.removeHandler(h)
            continue
        previous = logging.getLoggerClass()
        logging.setLoggerClass(_Adopted)
        try:
            logging.getLogger(name)
        finally:
            logging.setLoggerClass(previous)


def configure_logging(fmt: str = "auto", level: str = "warning",
                      stream: TextIO | None = None, *, tracebacks: bool | None = None) -> None:
    """Set up both kinds of line for this process (again, when called again), on `stream`
    (stderr by default). `fmt`: `auto` or `console` (human lines), `json`. `tracebacks`: show
    an exception's traceback on a human line (default: when `level` is debug)."""
    global _handler, _json_stream
    stream = stream or sys.stderr
    json_lines = fmt == "json"
    _json_stream = stream if json_lines else None
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.WARNING)
    if tracebacks is None:
        tracebacks = numeric <= logging.DEBUG
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if json_lines
        else structlog.dev.ConsoleRenderer(colors=stream.isatty(),
                                           exception_formatter=structlog.dev.plain_traceback)
    )
    stamp = structlog.processors.TimeStamper(fmt="iso")
    # a traceback as a string field in JSON; on a human line one `error` field unless asked
    exc: list[structlog.typing.Processor] = (
        [structlog.processors.format_exc_info] if json_lines
        else [] if tracebacks else [_quiet])
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
    if not json_lines and not tracebacks:
        handler.addFilter(_logged_already)
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    root.addHandler(handler)
    root.setLevel(numeric)
    _handler = handler
    _adopt_library_loggers()
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
