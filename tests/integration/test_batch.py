"""BatchWorkflow on the real Temporal dev server and PostgreSQL: a 200-task batch at
concurrency 20 survives a worker restart and a resubmission without running any task twice,
continues as new, writes its report, and its runs are found by search attributes."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

from conductor_engine.engine.contracts.tasks import RunOptions, Task
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.trace_store import TraceFilter, TraceStore
from conductor_engine.runtime.client import ConductorClient
from tests.batches import wait_done
from tests.cli import CONDUCTOR, stack_env
from tests.conftest import make_pool, running_worker
from tests.plans import plan_json

N = 200


def _conductor(prompt: str) -> str:
    """Tasks whose number ends in 7 get an unparseable plan (reward 0); the rest 3 steps."""
    m = re.search(r"Compute (\d+) \+ 1", prompt)
    if m and m.group(1).endswith("7"):
        return "no plan"
    return plan_json(("gpt", "Read the number.", []), ("claude", "Add one.", [0]),
                     ("gemini", "State the result.", "all"))


def _gemini(prompt: str) -> str:
    """Right for even numbers (reward 1), one too many for odd ones (reward 0.5)."""
    n = int(re.search(r"Compute (\d+) \+ 1", prompt).group(1))  # type: ignore[union-attr]
    return f"The answer is {n + 1 if n % 2 == 0 else n + 2}"


def _tasks(prefix: str) -> list[Task]:
    return [Task(id=f"{prefix}-{i:03d}", question=f"Compute {i} + 1.", reference=str(i + 1),
                 verifier="math", dataset="arith",
                 options=RunOptions(max_plan_attempts=1))
            for i in range(N)]


@pytest.mark.slow  # a whole batch through a fault, 30-60 s: `pytest -m slow`; CI runs it
async def test_a_200_task_batch_survives_a_worker_restart_and_a_resubmission(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings,
    trace_store: TraceStore,
) -> None:
    agent_server.set_responder("conductor", _conductor)
    agent_server.set_responder("gpt", lambda p: "the number")
    agent_server.set_responder("claude", lambda p: "plus one")
    agent_server.set_responder("gemini", _gemini)
    pool = make_pool(agent_server)
    name = f"arith-{uuid.uuid4().hex[:6]}"
    tasks = _tasks(name)

    async with running_worker(client, settings, pool):
        wid, started = await conductor.submit_batch(name, tasks, concurrency=20,
                                                    children_per_run=80)
        assert started
        while (await conductor.batch_progress(name))[1] is None or (
                (await conductor.batch_progress(name))[1].done < 50):  # type: ignore[union-attr]
            await asyncio.sleep(0.2)
        _, mid = await conductor.batch_progress(name)
        assert mid is not None and 0 < mid.running <= 20, "a sliding window of at most 20"
    # the worker is gone mid-batch; a new one carries on
    async with running_worker(client, settings, pool):
        await wait_done(conductor, name, timeout=240)
        status, p = await conductor.batch_progress(name)
        assert status == "completed" and p is not None and p.finished
        assert p.total == N and p.completed == N and p.failed == 0 and p.skipped == 0
        assert p.continued >= 2, "200 children at 80 per run continue as new twice"
        assert agent_server.calls("conductor") == N, "one plan per task, none repeated"
        gemini_calls = agent_server.calls("gemini")

        # the same batch again: everything completed, so nothing runs
        _, again = await conductor.submit_batch(name, tasks, concurrency=20)
        assert again
        await wait_done(conductor, name, timeout=240)
        _, p2 = await conductor.batch_progress(name)
        assert p2 is not None and p2.skipped == N and p2.completed == 0
        assert agent_server.calls("conductor") == N and agent_server.calls("gemini") == gemini_calls

        # the UI's filter box: runs of this batch with reward 0 are the unparseable plans
        zero = {f"batch-{name}/{t.id}" for t in tasks if t.id.endswith("7")}
        found: set[str] = set()
        for _ in range(50):
            found = {r.workflow_id for r in await conductor.list(
                batch=name, query="ConductorReward = 0", limit=1000)}
            if found == zero:
                break
            await asyncio.sleep(0.2)
        assert found == zero

    # one trace per task, rewards by the paper's scheme, and the report on the worker's disk
    assert await trace_store.count(TraceFilter(batch=name)) == N
    traces = await trace_store.batch_traces(name)
    rewards = {t.task.id: t.reward.value for t in traces if t.reward}
    assert rewards[f"{name}-000"] == 1.0 and rewards[f"{name}-001"] == 0.5
    assert rewards[f"{name}-007"] == 0.0
    assert p.report_dir is not None
    report = Path(p.report_dir)
    rows = [json.loads(line) for line in (report / "results.jsonl").read_text().splitlines()]
    assert len(rows) == N
    summary = json.loads((report / "summary.json").read_text())
    assert summary["accuracy"] == 0.5 and summary["by_status"]["invalid_plan"] == 20
    assert set(summary["agents"]) == {"gpt", "claude", "gemini"}
    assert summary["agents"]["gemini"]["seconds"]["p50"] >= 0
    md = (report / "tasks" / f"{name}-000.md").read_text()
    assert "The answer is 1" in md and "Step 3 · gemini" in md


async def test_conductor_batch_runs_a_task_file_and_writes_the_report(
    agent_server, client: Client, settings: Settings, tmp_path: Path, repo_root: Path,
) -> None:
    """The CLI against a running cluster-style server: progress bar, then the report path;
    `batch report` rewrites the report from the trace store."""

    from tests.conftest import write_pool

    agent_server.set_responder("conductor", lambda p: plan_json(("gpt", "Answer it.", [])))
    agent_server.set_responder("gpt", lambda p: "Answer: 1024")
    pool = make_pool(agent_server)
    name = f"cli-{uuid.uuid4().hex[:6]}"
    env = stack_env(settings, write_pool(pool, tmp_path / "pool.toml"))

    async def conductor(*args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            *CONDUCTOR, *args, env=env, cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        return proc.returncode or 0, out.decode(), err.decode()

    async with running_worker(client, settings, pool):
        code, out, err = await conductor(
            "batch", str(repo_root / "examples" / "tasks.jsonl"), "--name", name,
            "--concurrency", "2")
        assert code == 0, err
        assert "5/5" in err and f"batch {name} started" in " ".join(err.split())
        report = Path(out.split("report: ", 1)[1].split()[0])
        summary = json.loads((report / "summary.json").read_text())
        assert summary["tasks"] == 5 and summary["with_reference"] == 5
        assert summary["accuracy"] == 0.2, "only the 2^10 question's answer is 1024"
        code, out, err = await conductor("batch", "report", name)
        assert code == 0, err
        assert (tmp_path / "batches" / name / "tasks" / "pow-compare.md").is_file()
        assert "accuracy: 0.200" in out


def test_the_task_report_lists_the_sources_web_searching_agents_cited() -> None:
    from conductor_engine.engine.contracts.agent_calls import Citation
    from conductor_engine.engine.storage.batch_report import task_markdown
    from tests.traces import make_trace

    trace = make_trace("cited")
    trace.steps[2].citations = [Citation(url="https://example.org/a", title="A [survey]")]
    trace.steps[0].citations = [Citation(url="https://example.org/b")]
    md = task_markdown(trace)
    answer_part, steps_part = md.split("## Round 1")
    assert "- [A \\[survey\\]](https://example.org/a)" in answer_part, "the answer's sources"
    assert "- [https://example.org/b](https://example.org/b)" in steps_part
