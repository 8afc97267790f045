"""Names a stored format keeps: traces in PostgreSQL and payloads in Temporal histories written
under a field's older name still read, and what is written now uses the current name."""

from __future__ import annotations

import json

from conductor_engine.engine.contracts.traces import Trace
from tests.traces import make_trace


def test_a_trace_stored_with_saw_reads_its_steps_as_sees() -> None:
    doc = json.loads(make_trace("old").document_json())
    steps = doc["rounds"][0]["steps"]
    assert [s["sees"] for s in steps] == [[], [], [0, 1]] and "saw" not in steps[2]
    for s in steps:
        s["saw"] = s.pop("sees")
    read = Trace.from_document(doc)
    assert [s.sees for s in read.steps] == [[], [], [0, 1]]
