"""Every log line is JSON in JSON mode: the engine's (structlog) and the standard library's (the
Temporal SDK's `temporalio.*` loggers), with level, timestamp and event, secrets redacted. By
default, in a terminal and in a pipe alike, lines are human ones: a failure is one line, its
traceback (never with local variables) only when asked, and no library line is printed twice."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator

import pytest
import structlog
from typer.testing import CliRunner

from conductor_engine.runtime.cli import app
from conductor_engine.runtime.logging import configure_logging

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
    from conductor_engine.runtime.logging import announce_json

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


def _failed_activity(hint: str) -> None:
    """What the Temporal SDK logs when an activity attempt fails (worker/_activity.py)."""
    secret_local = "a local variable's value"  # noqa: F841 (a traceback with locals shows it)
    try:
        raise RuntimeError(f"agent gpt-5: OPENAI_API_KEY is not set; {hint}\nsecond line")
    except RuntimeError:
        logging.getLogger("temporalio.activity").warning(
            "Completing activity as failed ({'activity_id': '1', 'activity_type': 'call_agent'})",
            exc_info=True, extra={"__temporal_error_identifier": "ActivityFailure",
                                  "temporal_activity": {"activity_id": "1", "attempt": 2,
                                                        "activity_type": "call_agent",
                                                        "workflow_id": "conduct-1"}})


def test_a_failure_in_a_pipe_is_one_human_line_saying_what_to_do() -> None:
    out = io.StringIO()  # not a terminal: a pipe
    try:
        configure_logging("auto", "warning", stream=out)
        _failed_activity("export it")
    finally:
        configure_logging("auto", "warning")
    [line] = out.getvalue().splitlines()
    assert not line.startswith("{") and "\x1b[" not in line, "human, uncoloured"
    assert "Completing activity as failed" in line and "activity_type=call_agent" in line
    assert "error='RuntimeError: agent gpt-5: OPENAI_API_KEY is not set; export it'" in line
    assert "attempt=2" in line and "workflow_id=conduct-1" in line
    assert "{'activity_id'" not in line and "__temporal" not in line and "Traceback" not in line


def test_a_traceback_only_when_asked_and_never_with_local_variables() -> None:
    out = io.StringIO()
    try:
        configure_logging("console", "warning", stream=out, tracebacks=True)
        _failed_activity("export it")
        configure_logging("console", "debug", stream=(debug := io.StringIO()))
        _failed_activity("export it")
    finally:
        configure_logging("auto", "warning")
    for text in (out.getvalue(), debug.getvalue()):
        assert "Traceback (most recent call last)" in text and "second line" in text
        assert "a local variable's value" not in text


def test_a_hugging_face_line_is_printed_once() -> None:
    """huggingface_hub puts a stderr handler of its own on its logger and propagates to the root
    one as well: its retry lines were printed twice. Imported before or after the set-up."""
    import huggingface_hub.utils.logging  # noqa: F401 (its handler, if first imported here)

    out = io.StringIO()
    try:
        configure_logging("auto", "warning", stream=out)
        assert not [h for h in logging.getLogger("huggingface_hub").handlers
                    if type(h) is logging.StreamHandler]
        logging.getLogger("huggingface_hub.utils._http").warning("Retrying in 1s [Retry 1/5].")
    finally:
        configure_logging("auto", "warning")
    assert len(out.getvalue().splitlines()) == 1
    later = subprocess.run([sys.executable, "-c", (
        "import logging\n"
        "from conductor_engine.runtime.logging import configure_logging\n"
        "configure_logging('auto', 'warning')\n"
        "import huggingface_hub.utils.logging\n"
        "logging.getLogger('huggingface_hub.utils._http').warning('Retrying in 1s')\n")],
        capture_output=True, text=True, timeout=120, check=True)
    assert later.stderr.count("Retrying in 1s") == 1, later.stderr


def test_conductor_log_names_a_level_and_refuses_a_misspelt_one() -> None:
    bad = CliRunner().invoke(app, ["pool", "show"], env={"CONDUCTOR_LOG": "verbose"})
    assert bad.exit_code == 2
    assert "CONDUCTOR_LOG='verbose' is no log level; use one of debug, info" in bad.output
    good = CliRunner().invoke(app, ["--verbose", "pool", "show"], env={"CONDUCTOR_LOG": "debug"})
    assert good.exit_code == 0, good.output


def test_a_failed_model_call_is_said_once_the_activitys_own_line() -> None:
    """The call_agent activity logs `agent call failed` with its step, agent and what to do,
    then raises: the SDK's `Completing activity as failed` for the same failure is left out of
    a quiet log, kept with tracebacks on."""
    from temporalio.exceptions import ApplicationError

    from conductor_engine.engine.providers.base import AgentCallError

    def fail_the_sdk_way() -> None:
        try:
            try:
                raise AgentCallError("OPENAI_API_KEY is not set; export it", retryable=False)
            except AgentCallError as e:
                structlog.get_logger().warning("agent call failed", error=str(e), agent="gpt-5")
                raise ApplicationError(str(e), type="AgentKeyMissing") from e
        except ApplicationError:
            logging.getLogger("temporalio.activity").warning("Completing activity as failed",
                                                             exc_info=True)

    quiet, verbose = io.StringIO(), io.StringIO()
    try:
        configure_logging("auto", "warning", stream=quiet)
        fail_the_sdk_way()
        configure_logging("auto", "warning", stream=verbose, tracebacks=True)
        fail_the_sdk_way()
    finally:
        configure_logging("auto", "warning")
    [line] = quiet.getvalue().splitlines()
    assert "agent call failed" in line and "export it" in line
    assert "Completing activity as failed" in verbose.getvalue()


def test_verbose_works_after_the_command_too() -> None:
    from conductor_engine.runtime.cli import verbose_first

    assert verbose_first(["run", "q", "--verbose"]) == ["--verbose", "run", "q"]
    assert verbose_first(["--verbose", "pool", "show"]) == ["--verbose", "pool", "show"]
    assert verbose_first(["run", "--", "--verbose"]) == ["run", "--", "--verbose"]
    assert verbose_first(["pool", "show"]) == ["pool", "show"]
