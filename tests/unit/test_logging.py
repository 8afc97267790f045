"""Every log line is JSON in JSON mode: the engine's (structlog) and the standard library's (the
Temporal SDK's `temporalio.*` loggers), with level, timestamp and event, secrets redacted."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from conductor_engine.engine.runtime.logging import configure_logging

KEY = "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv"  # shaped like a key, made up


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    out = io.StringIO()
    configure_logging("json", "info", stream=out)
    yield out
    configure_logging("auto", "warning")  # as the other tests found it


def _parsed(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_the_sdks_lines_and_the_engines_are_json_with_secrets_redacted(
    lines: io.StringIO,
) -> None:
    structlog.get_logger().warning("agent call failed", agent="gpt",
                                   error=f"401 from https://u:hunter2@api.example/v1 key {KEY}")
    try:
        raise RuntimeError(f"echoed {KEY}")
    except RuntimeError:
        logging.getLogger("temporalio.activity").warning(
            "Completing activity as failed (%s)", {"activity_type": "call_agent"},
            exc_info=True, extra={"temporal_activity": {"activity_type": "call_agent",
                                                        "note": f"key {KEY}"}})
    logging.getLogger("temporalio.worker").info("worker polling")
    logging.getLogger("temporalio.worker").debug("below the level: not written")

    engine, sdk, info = _parsed(lines)
    text = lines.getvalue()
    assert KEY not in text and "hunter2" not in text
    for line in (engine, sdk, info):
        assert {"level", "timestamp", "event"} <= set(line), line
    assert engine["level"] == "warning" and engine["agent"] == "gpt"
    assert "https://u:***@api.example/v1" in str(engine["error"])
    assert sdk["level"] == "warning" and sdk["logger"] == "temporalio.activity"
    assert str(sdk["event"]).startswith("Completing activity as failed")
    assert sdk["temporal_activity"] == {"activity_type": "call_agent", "note": "key ***"}
    assert "RuntimeError: echoed ***" in str(sdk["exception"])
    assert info == {**info, "level": "info", "logger": "temporalio.worker",
                    "event": "worker polling"}


def test_reconfiguring_replaces_the_handler_rather_than_adding_one(lines: io.StringIO) -> None:
    again = io.StringIO()
    configure_logging("json", "info", stream=again)
    logging.getLogger("temporalio").warning("once")
    assert lines.getvalue() == "" and len(again.getvalue().splitlines()) == 1


def test_a_services_start_line_is_json_in_json_mode_whatever_the_level() -> None:
    from conductor_engine.engine.runtime.logging import announce_json

    out = io.StringIO()
    try:
        configure_logging("json", "error", stream=out)
        assert announce_json("worker polling", task_queue="q", address=f"https://u:{KEY}@h")
        configure_logging("console", "error", stream=io.StringIO())
        assert not announce_json("worker polling"), "a terminal prints its own line"
    finally:
        configure_logging("auto", "warning")
    [line] = _parsed(out)
    assert line["event"] == "worker polling" and line["level"] == "info" and "timestamp" in line
    assert KEY not in out.getvalue()
