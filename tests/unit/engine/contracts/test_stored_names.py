"""Names a stored format keeps: traces in PostgreSQL and payloads in Temporal histories written
under a field's older name still read, and what is written now uses the current name."""

from __future__ import annotations

import json
from pathlib import Path

from temporalio.client import WorkflowHistory

from conductor_engine.engine.contracts.activities import AgentCallInput
from conductor_engine.engine.contracts.traces import Trace
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.payloads import data_converter
from conductor_engine.runtime.history.events import group_events
from conductor_engine.runtime.history.reading import _Builder
from tests.paths import TESTS
from tests.traces import make_trace

HISTORIES = TESTS / "integration" / "histories"


def test_a_trace_stored_with_saw_reads_its_steps_as_sees() -> None:
    doc = json.loads(make_trace("old").document_json())
    steps = doc["rounds"][0]["steps"]
    assert [s["sees"] for s in steps] == [[], [], [0, 1]] and "saw" not in steps[2]
    for s in steps:
        s["saw"] = s.pop("sees")
    read = Trace.from_document(doc)
    assert [s.sees for s in read.steps] == [[], [], [0, 1]]


def test_an_agent_call_written_with_visible_reads_as_seen() -> None:
    step = {"index": 0, "agent": "gpt", "subtask": "Recall.", "output": "1024"}
    old = AgentCallInput.model_validate({"agent": "claude", "question": "q", "subtask": "s",
                                         "visible": [step]})
    assert [s.output for s in old.seen] == ["1024"]
    assert "visible" not in old.model_dump() and old.model_dump()["seen"] == [step]


async def test_a_history_recorded_before_the_renames_shows_what_each_step_sees(
    tmp_path: Path,
) -> None:
    """v3's histories hold `visible` in agent calls and `saw` in step records: `conductor
    history` still shows each step's view from them."""
    saved = json.loads((HISTORIES / "v3_conduct.json").read_text())
    assert '"visible"' not in json.dumps(saved)  # the payloads are encoded, not plain JSON
    history = WorkflowHistory.from_json(saved["workflow_id"], saved["history"])
    trail = await _Builder(data_converter(Settings(data_dir=tmp_path)), saved["workflow_id"],
                           "", group_events(history.events)).build()
    last = trail.rounds[0].steps[2]
    assert last.sees == [0, 1] and [s.output for s in last.seen][1] == "1024"
    assert last.seen[0].output, "the self-call's answer, seen by the last step"
