"""The fault suite's accounting: what each fault did to the runs it hit, counted from the real
records (Temporal's own view of each run, the trace store, the agent server's bills), never
from what the engine says about itself.

For a batch hit by a fault:
- submitted: the tasks handed to the batch.
- completed / failed: ended runs by their trace's status; a failed run's reason must be one
  clear line (no traceback, not empty, not a wall of text), else it counts as unclear.
- lost: runs whose workflow did not end as a run ends (completed, or failed by the engine with
  its reason): terminated, timed out, still running, or unknown to the server.
- billed twice: answers the agent server wrote to a client (what a provider bills) beyond the
  calls the traces record as completed (a plan attempt, a finished step). Temporal runs an
  activity at least once, so only a call in flight when the fault hit may be repeated; an answer
  the engine received and then lost would show here.
- traces missing: ended runs with no trace.

`ROWS` collects one `FaultRow` per fault kind; tests/faults/conftest.py prints them as a table
at the end of the run (and writes it as Markdown where CONDUCTOR_FAULT_TABLE names a file).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from conductor_engine.engine.contracts.names import batch_child_workflow_id
from conductor_engine.engine.contracts.traces import Trace
from conductor_engine.engine.storage.trace_store import TraceStore

MAX_REASON_CHARS = 600


@dataclass
class FaultRow:
    kind: str
    submitted: int
    completed: int = 0
    failed: int = 0
    unclear: int = 0  # failed runs whose reason is not one clear line (must be 0)
    lost: int = 0
    billed_twice: int = 0
    traces_missing: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    example: str = ""  # one failed run's reason, as the user reads it
    seconds: float = 0.0
    note: str = ""

    def check(self) -> None:
        """The suite's promise: nothing lost, nothing paid twice, every trace, clear reasons."""
        assert self.lost == 0, f"{self.kind}: {self.lost} runs lost"
        assert self.billed_twice == 0, f"{self.kind}: {self.billed_twice} completed calls repaid"
        assert self.traces_missing == 0, f"{self.kind}: {self.traces_missing} traces missing"
        assert self.unclear == 0, f"{self.kind}: {self.unclear} failures without a clear reason"
        assert self.completed + self.failed == self.submitted, self


ROWS: list[FaultRow] = []


def clear_reason(error: str | None) -> bool:
    """One line a person can act on: present, short, no traceback, and true at the end of the
    run (a final failure must not say it "will be retried")."""
    if not error or not error.strip():
        return False
    return "\n" not in error.strip() and "Traceback" not in error \
        and "will be retried" not in error and len(error) <= MAX_REASON_CHARS


def reason_kind(trace: Trace) -> str:
    """What a failure was, for the table: its status and the error's type where recorded."""
    return f"{trace.status} ({trace.failure})" if trace.failure else trace.status


def recorded_calls(traces: Iterable[Trace], model_of: Mapping[str, str]) -> Counter[str]:
    """Calls the traces hold as answered, per model: each plan attempt the conductor answered
    (its raw text is recorded, even when it was no plan) and each finished step."""
    calls: Counter[str] = Counter()
    for t in traces:
        for rnd in t.rounds:
            for a in rnd.attempts:
                if a.raw_text or a.usage.output_tokens:
                    calls[model_of.get(a.conductor_id, a.conductor_id)] += 1
            for s in rnd.steps:
                if s.status == "done" and s.child_workflow_id is None:
                    calls[model_of.get(s.agent, s.agent)] += 1
    return calls


ENDED = (WorkflowExecutionStatus.COMPLETED, WorkflowExecutionStatus.FAILED)
"""How a run ends: completed, or failed by the engine with its reason (a step out of retries).
Terminated, timed out, still running or unknown to the server: lost."""


async def ended_runs(client: Client, workflow_ids: Iterable[str]) -> dict[str, bool]:
    """Whether each workflow ended as a run should (ENDED) on the server."""
    out: dict[str, bool] = {}
    for wid in workflow_ids:
        try:
            desc = await client.get_workflow_handle(wid).describe()
        except RPCError:
            out[wid] = False
            continue
        out[wid] = desc.status in ENDED
    return out


async def account(
    kind: str, *, client: Client, store: TraceStore, batch: str, task_ids: list[str],
    billed: Mapping[str, int], model_of: Mapping[str, str], seconds: float, note: str = "",
) -> FaultRow:
    """The row for a batch `batch` of `task_ids`: see the module docstring. `billed` is the
    agent server's count of billed answers per model; `model_of` maps agent ids to models."""
    row = FaultRow(kind=kind, submitted=len(task_ids), seconds=seconds, note=note)
    traces = {t.task.id: t for t in await store.batch_traces(batch)}
    ended = await ended_runs(client, [batch_child_workflow_id(batch, t) for t in task_ids])
    for task_id in task_ids:
        if not ended[batch_child_workflow_id(batch, task_id)]:
            row.lost += 1
            continue
        trace = traces.get(task_id)
        if trace is None:
            row.traces_missing += 1
            continue
        if trace.status == "completed":
            row.completed += 1
            continue
        row.failed += 1
        row.reasons[reason_kind(trace)] += 1
        row.example = row.example or (trace.error or "")
        if not clear_reason(trace.error):
            row.unclear += 1
    recorded = recorded_calls(traces.values(), model_of)
    row.billed_twice = sum(max(0, n - recorded[m]) for m, n in billed.items())
    ROWS.append(row)
    return row
