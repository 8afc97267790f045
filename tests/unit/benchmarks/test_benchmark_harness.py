"""The training benchmarks' harness (tests/benchmarks/_harness.py): polling that outlives a
loaded machine, and the traces a benchmark keeps."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest
from temporalio.service import RPCError, RPCStatusCode

from conductor_engine.engine.storage.trace_store import TraceStore
from tests.benchmarks._harness import iteration_line, patiently


def test_a_query_that_timed_out_is_asked_again_and_a_real_error_is_raised_at_once() -> None:
    calls = [0]

    async def times_out_twice() -> str:
        calls[0] += 1
        if calls[0] < 3:
            raise RPCError("Timeout expired", RPCStatusCode.UNKNOWN, b"")
        return "progress"

    assert asyncio.run(patiently(times_out_twice, pause=0.0)) == "progress"
    assert calls[0] == 3

    async def not_found() -> str:
        calls[0] += 1
        raise RPCError("workflow not found", RPCStatusCode.NOT_FOUND, b"")

    calls[0] = 0
    with pytest.raises(RPCError, match="not found"):
        asyncio.run(patiently(not_found, pause=0.0))
    assert calls[0] == 1

    async def always_times_out() -> str:
        raise RPCError("deadline", RPCStatusCode.DEADLINE_EXCEEDED, b"")

    with pytest.raises(RPCError):
        asyncio.run(patiently(always_times_out, tries=3, pause=0.0))


def test_a_query_the_starved_worker_could_not_answer_is_asked_again_others_raise() -> None:
    from temporalio.client import WorkflowQueryFailedError

    calls = [0]

    async def starved_once() -> str:
        calls[0] += 1
        if calls[0] == 1:
            raise WorkflowQueryFailedError("[TMPRL1101] Potential deadlock detected: "
                                           "workflow didn't yield within 2 second(s).")
        return "progress"

    assert asyncio.run(patiently(starved_once, pause=0.0)) == "progress"
    assert calls[0] == 2

    async def query_raised() -> str:
        calls[0] += 1
        raise WorkflowQueryFailedError("KeyError: 'iteration'")

    calls[0] = 0
    with pytest.raises(WorkflowQueryFailedError, match="KeyError"):
        asyncio.run(patiently(query_raised, pause=0.0))
    assert calls[0] == 1


def test_an_iteration_line_counts_the_runs_left_out_of_its_mean() -> None:
    from conductor_engine.engine.contracts.training_runs import IterationStats

    starved = IterationStats(iteration=0, version="base", rollouts=10, mean_reward=0.85,
                             valid_plan_rate=1.0, left_out={"PlanFailed": 22},
                             update_left_out={"PlanFailed": 22})
    line = iteration_line(starved)
    assert "reward 0.850" in line and "10 scored" in line
    assert "left out 22 (PlanFailed 22)" in line and "update left out" not in line
    whole = IterationStats(iteration=3, version="v3", rollouts=32, mean_reward=0.5)
    assert "left out" not in iteration_line(whole)


async def test_every_stored_trace_is_kept_as_a_json_line_across_pages(
    trace_store: TraceStore, tmp_path: Path,
) -> None:
    """`--keep-traces`: a benchmark's store is removed when it ends; its traces are written
    out first, every one whatever the page size (the store is shared: other tests' too)."""
    from conductor_engine.engine.contracts.traces import Trace
    from tests.benchmarks._harness import dump_traces
    from tests.traces import make_trace

    ours = [make_trace(f"keep-{uuid.uuid4().hex[:6]}") for _ in range(3)]
    ours[1].answer = "half a pair: \ud800"  # an agent's unencodable text, stored as it came
    for trace in ours:
        await trace_store.write(trace)
    out = tmp_path / "traces.jsonl"
    written = await dump_traces(trace_store, out, page=2)
    kept = [Trace.model_validate(json.loads(line)) for line in out.read_text().splitlines()]
    assert written == len(kept) >= 3
    assert {t.workflow_id for t in ours} <= {t.workflow_id for t in kept}
    assert {t.task.id for t in kept if t.workflow_id == ours[0].workflow_id} == {ours[0].task.id}
    assert [t.answer for t in kept if t.workflow_id == ours[1].workflow_id] == [ours[1].answer]
