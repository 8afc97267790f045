"""The CLI's one step table: the saw label, shortening, and escaping of model-written text."""

from __future__ import annotations

import importlib
import io
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from conductor_engine.engine.contracts.records import RoundRecord, StepRecord
from conductor_engine.engine.plan.language import Step, saw_label
from conductor_engine.engine.rewards import Reward, RewardWeights
from conductor_engine.engine.runtime.cli import app
from conductor_engine.engine.runtime.cli import traces as cli_traces
from conductor_engine.engine.runtime.cli.render import (
    record_rows,
    reward_line,
    shorten,
    steps_table,
    trail_rows,
)
from conductor_engine.engine.runtime.history import AttemptError, TrailRound, TrailStep
from tests.traces import make_trace

# The module, not the Typer app of the same name that the package exports.
cli_app = importlib.import_module("conductor_engine.engine.runtime.cli.app")


def _text(table: object) -> str:
    console = Console(width=200, file=io.StringIO(), color_system=None)
    console.print(table)
    assert isinstance(console.file, io.StringIO)
    return console.file.getvalue()


def test_the_saw_label_names_steps_from_one() -> None:
    assert saw_label([]) == "none" and saw_label([0, 2]) == "1,3"
    assert saw_label([0, 1], "all") == "all" and saw_label([0, 1], [0, 1]) == "1,2"
    assert Step(agent="a", subtask="s", access="all").access_label() == "all"
    assert Step(agent="a", subtask="s", access=[2, 0, 2]).access_label() == "1,3"
    assert Step(agent="a", subtask="s", access=[]).access_label() == "none"


def test_shorten_puts_text_on_one_line_and_marks_the_cut() -> None:
    assert shorten("a\n  b", None) == "a\n  b"
    assert shorten("a\n  b", 10) == "a b"
    assert shorten("abcdefghij", 5) == "abcd…"


def test_a_run_says_all_where_history_lists_the_steps_seen() -> None:
    steps = [StepRecord(round=0, index=i, agent="gpt", subtask="s", access=acc, saw=saw)
             for i, (acc, saw) in enumerate([([], []), ("all", [0])])]
    rnd = RoundRecord(index=0, steps=steps)
    assert [r.saw for r in record_rows(rnd, say_all=True)] == ["none", "all"]
    assert [r.saw for r in record_rows(rnd)] == ["none", "1"]
    trail = TrailRound(index=0, steps=[TrailStep(round=0, index=1, agent="gpt", subtask="s",
                                                 access="all", saw=[0])])
    assert [r.saw for r in trail_rows(trail)] == ["1"]


def test_the_table_prints_model_text_literally() -> None:
    step = TrailStep(round=0, index=0, agent="gpt", subtask="set arr[i] to [/x]",
                     output="[red]not red", status="failed", child_workflow_id="child",
                     errors=[AttemptError(attempt=1, message="HTTP 429 [b]")])
    text = _text(steps_table(trail_rows(TrailRound(index=0, steps=[step])),
                             ("step", "subtask", "output", "attempts", "errors")))
    assert "set arr[i] to [/x]" in text and "[red]not red" in text and "#1: HTTP 429 [b]" in text
    assert "1/1" in text and "0 (self-call)" in text
    assert "tokens" not in text, "only the columns asked for"


# --- user and model text is never Rich markup; help text shows as written --------------------

HOSTILE = ["[/code]", "[bold]x", "[@SPLIT]", "[link=file:///etc/passwd]x[/link]", "ends\\"]


@pytest.fixture
def printed(monkeypatch: pytest.MonkeyPatch) -> Callable[[], str]:
    """What the CLI's two consoles print, as plain text (markup not rendered twice)."""
    consoles = {name: Console(width=300, file=io.StringIO(), color_system=None)
                for name in ("out", "err")}
    for module in (cli_app, cli_traces):
        for name, console in consoles.items():
            if hasattr(module, name):
                monkeypatch.setattr(module, name, console)

    def text() -> str:
        return "".join(c.file.getvalue() for c in consoles.values()  # type: ignore[attr-defined]
                       )
    return text


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_trace_prints_hostile_text_verbatim(hostile: str, printed: Callable[[], str]) -> None:
    trace = make_trace(f"id-{hostile}", dataset=f"ds-{hostile}", output=f"out {hostile}")
    trace = trace.model_copy(update={
        "task": trace.task.model_copy(update={"question": f"q {hostile}",
                                              "tags": [f"t{hostile}"]}),
        "error": f"err {hostile}"})
    cli_traces._print_trace(trace, limit=None)
    text = printed()
    for expected in (f"id-{hostile}", f"ds-{hostile}", f"q {hostile}", f"t{hostile}",
                     f"out {hostile}", f"err {hostile}"):
        assert expected in text, expected


@pytest.mark.parametrize("hostile", HOSTILE)
def test_an_error_line_and_a_reward_line_print_hostile_text_verbatim(
        hostile: str, printed: Callable[[], str]) -> None:
    cli_app.fail(f"no trace of {hostile}")
    assert f"error: no trace of {hostile}" in printed()
    reward = Reward(value=0.5, reason=f"wrong {hostile}", weights=RewardWeights())
    console = Console(width=300, file=io.StringIO(), color_system=None)
    console.print(reward_line(reward))
    assert f"reward: 0.5 (wrong {hostile})" in console.file.getvalue()  # type: ignore[attr-defined]


def test_brackets_in_help_text_show() -> None:
    runner = CliRunner()
    check = runner.invoke(app, ["tasks", "check", "--help"], terminal_width=200)
    assert "hf:NAME[:CONFIG][@SPLIT]" in check.output
    train = runner.invoke(app, ["train", "start", "--help"], terminal_width=200)
    assert "[policy], [loss], [rollouts]" in train.output


# --- every numeric flag has a range ----------------------------------------------------------

def _numeric_params(command: Any, path: str = "conductor") -> Iterator[tuple[str, Any]]:
    for name, sub in getattr(command, "commands", {}).items():
        yield from _numeric_params(sub, f"{path} {name}")
    for param in getattr(command, "params", []):
        descriptor = getattr(param, "type_descriptor", None)
        annotation = getattr(descriptor, "annotation", None)
        if annotation in (int, float):
            yield f"{path} {param.name}", param


def test_every_numeric_option_and_argument_has_a_range() -> None:
    params = dict(_numeric_params(typer.main.get_command(app)))
    assert "conductor traces list limit" in params and "conductor run temperature" in params
    unbounded = [name for name, p in params.items() if p.min is None and p.max is None
                 and not name.endswith(" concurrency")]  # set by cli/batches.py and train.py
    assert unbounded == []


@pytest.mark.parametrize("args", [
    ["traces", "list", "--limit", "-1"],
    ["run", "q", "--max-steps", "21"],
    ["run", "q", "--temperature", "nan"],
    ["train", "start", "--lr", "0"],
    ["plan", "check", "--pool-size", "0"],
])
def test_an_out_of_range_flag_is_a_usage_error_before_anything_runs(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Invalid value for" in result.output and "Traceback" not in result.output
