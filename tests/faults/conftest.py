"""The fault suite's table: one row per fault kind (tests/faults/ledger.py), printed at the end
of the run, and written as Markdown to the file CONDUCTOR_FAULT_TABLE names, if any."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.faults.ledger import ROWS, FaultRow

HEADER = ("fault", "runs", "completed", "failed (clear reason)", "lost", "steps billed twice",
          "traces missing", "s")


def _cells(row: FaultRow) -> tuple[str, ...]:
    return (row.kind, str(row.submitted), str(row.completed), str(row.failed), str(row.lost),
            str(row.billed_twice), str(row.traces_missing), f"{row.seconds:.0f}")


def markdown(rows: list[FaultRow]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    notes = [f"- {r.kind}: {r.note}" + (f" Failures: {dict(r.reasons)}, e.g. \"{r.example}\""
                                       if r.reasons else "")
             for r in rows if r.note or r.reasons]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not ROWS:
        return
    terminalreporter.section("fault suite")
    terminalreporter.write(markdown(ROWS))
    if target := os.environ.get("CONDUCTOR_FAULT_TABLE"):
        Path(target).write_text(markdown(ROWS))
