"""The CLI's one step table: the saw label, shortening, and escaping of model-written text."""

from __future__ import annotations

import io

from rich.console import Console

from conductor_engine.engine.contracts.records import RoundRecord, StepRecord
from conductor_engine.engine.plan.language import Step, saw_label
from conductor_engine.engine.runtime.cli.render import (
    record_rows,
    shorten,
    steps_table,
    trail_rows,
)
from conductor_engine.engine.runtime.history import AttemptError, TrailRound, TrailStep


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
