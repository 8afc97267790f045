"""`conductor eval` end to end on the sim pool (examples/sim/pool.toml) against the real
Temporal dev server and PostgreSQL: every baseline and a refinement-round curve, one batch, one
table, the report files and the `--json` rows. The conductor is a scripted model that routes
each task to the agent competent at its tag, so it must beat the best single agent."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from pathlib import Path

from temporalio.client import Client

from conductor_engine.engine.eval import EvalSpec, run_eval
from conductor_engine.engine.eval.systems import moa_plan, random_plan
from conductor_engine.engine.providers.pool import AgentSpec, Pool
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.trace_store import TraceFilter, TraceStore
from conductor_engine.engine.tasks.files import load_tasks
from conductor_engine.runtime.client import ConductorClient
from tests.cli import CONDUCTOR, stack_env
from tests.conftest import free_port, running_worker, write_pool
from tests.plans import plan_json

ROOT = Path(__file__).resolve().parents[2]
PER_TAG = 2


def sim_setup(agent_server, tmp_path: Path) -> tuple[Pool, Path, dict[str, str]]:  # type: ignore[no-untyped-def]
    """The shipped sim pool with a scripted conductor, and two tasks of each tag."""
    pool = Pool.load(ROOT / "examples/sim/pool.toml")
    conductor = pool.conductor.model_copy(update={
        "provider": "openai-compatible", "model": "conductor",
        "base_url": agent_server.openai_base_url})
    pool = pool.model_copy(update={"conductor": conductor})
    tasks, seen = [], {}
    for task in load_tasks(str(ROOT / "examples/sim/tasks.jsonl")).tasks:
        tag = task.tags[0]
        if seen.get(tag, 0) < PER_TAG:
            seen[tag] = seen.get(tag, 0) + 1
            tasks.append(task)
    competent = {t.question: max(pool.agents, key=lambda a: a.sim.skills.get(  # type: ignore[union-attr]
        t.tags[0], 0.0)).id for t in tasks}
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(t.model_dump_json(include={"id", "question", "reference", "verifier",
                                                       "tags", "dataset"}).replace(
        '"reference"', '"answer"') + "\n" for t in tasks))
    return pool, path, competent


async def test_conductor_eval_compares_the_conductor_with_every_baseline(
    agent_server, client: Client, settings: Settings, trace_store: TraceStore, tmp_path: Path,
) -> None:
    pool, task_file, competent = sim_setup(agent_server, tmp_path)

    def route(prompt: str) -> str:
        question = next(q for q in competent if q in prompt)
        return plan_json((competent[question], "Answer the question.", []))

    agent_server.set_responder("conductor", route)
    name = f"eval-{uuid.uuid4().hex[:6]}"
    # a terminal of 80 columns: the table must stay whole
    # (tests/unit/runtime/cli/test_cli_render.py)
    env = {**stack_env(settings, write_pool(pool, tmp_path / "pool.toml")), "COLUMNS": "80"}
    async with running_worker(client, settings, pool):
        proc = await asyncio.create_subprocess_exec(
            *CONDUCTOR, "eval", str(task_file), "--name", name, "--rounds", "1",
            "--json", str(tmp_path / "rows.json"), env=env, cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode == 0, err.decode()[-3000:]
    text = out.decode()
    rows = {r["system"]: r for r in json.loads((tmp_path / "rows.json").read_text())}
    agents = [a.id for a in pool.agents]
    best = next(s for s in rows if s.startswith("best single"))
    assert set(rows) == {"conductor r0", "conductor r1", "moa", "random", "chain", best,
                         *(f"single {a}" for a in agents)}, rows
    for row in rows.values():
        assert {"system", "accuracy", "mean_reward", "tokens_per_task", "cost_per_task",
                "p50_s", "p95_s"} <= set(row)
        assert row["tasks"] == len(competent)
    assert rows["conductor r0"]["accuracy"] > rows[best]["accuracy"], rows
    assert rows["conductor r0"]["delta_to_best_single"] > 0
    assert rows[best]["accuracy"] == max(rows[f"single {a}"]["accuracy"] for a in agents)
    assert rows["single alpha"]["calls_per_task"] == 1.0
    moa_calls = len(moa_plan(agents, agents[0], 2).steps)
    assert rows["moa"]["calls_per_task"] == moa_calls, "every proposer twice, then the aggregator"
    assert rows["conductor r0"]["calls_per_task"] == 2.0, "a plan and one step"
    assert rows["moa"]["cost_per_task"] > rows["single alpha"]["cost_per_task"]
    assert "conductor r0" in text and "best single" in text and "moa" in text
    assert max(len(line) for line in text.splitlines()) <= 80, text
    report = tmp_path / "evals" / name
    assert (report / "table.md").read_text().count("\n| ") >= len(rows)
    assert json.loads((report / "results.json").read_text()) == list(rows.values())
    assert (report / "accuracy.png").stat().st_size > 1000
    assert await trace_store.count(TraceFilter(batch=name)) == len(competent) * (
        len(rows) - 1), "one run per task and system (best single is a view, not runs)"
    assert agent_server.calls("conductor") >= 2 * len(competent)


async def _eval(env: dict[str, str], cwd: Path, *args: str) -> tuple[str, str]:
    proc = await asyncio.create_subprocess_exec(
        *CONDUCTOR, "eval", *args, env=env, cwd=cwd,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode == 0, err.decode()[-3000:]
    return out.decode(), err.decode()


async def test_eval_leaves_out_agents_that_cannot_run_and_never_shows_failures_as_results(
    agent_server, client: Client, settings: Settings, tmp_path: Path, monkeypatch,
) -> None:
    """An agent whose key is not set and one whose server is gone are left out with one line
    saying which and why; with --include-unusable their runs fail, and their rows count the
    failures and show n/a, never an accuracy of 0.000."""
    pool, _, _ = sim_setup(agent_server, tmp_path)
    monkeypatch.delenv("EVAL_TEST_UNSET_KEY", raising=False)
    gone = f"http://127.0.0.1:{free_port()}/v1"
    pool = pool.model_copy(update={"agents": [*pool.agents, AgentSpec(
        id="keyless", provider="openai", model="gpt", api_key_env="EVAL_TEST_UNSET_KEY",
        base_url=agent_server.openai_base_url), AgentSpec(
        id="gone", provider="openai-compatible", model="m", base_url=gone)]})
    tasks = tmp_path / "two.jsonl"  # one attempt per step: a refused connection fails at once
    tasks.write_text("".join(json.dumps({**json.loads(line), "options": {
        "max_steps": 1, "max_step_attempts": 1}}) + "\n" for line in (
        ROOT / "examples/sim/tasks.jsonl").read_text().splitlines()[:2]))
    agent_server.set_responder("conductor", lambda prompt: plan_json(("alpha", "Answer.", [])))
    env = {**stack_env(settings, write_pool(pool, tmp_path / "pool.toml")), "COLUMNS": "200"}
    name = f"usable-{uuid.uuid4().hex[:6]}"
    async with running_worker(client, settings, pool):
        out, err = await _eval(env, tmp_path, str(tasks), "--name", name, "--baselines",
                               "single", "--json", str(tmp_path / "rows.json"))
        [line] = [ln for ln in err.splitlines() if ln.startswith("left out")]
        assert line.startswith("left out 2 agent(s) that cannot run here: keyless "
                               "(EVAL_TEST_UNSET_KEY not set), gone (127.0.0.1:"), line
        assert "--include-unusable" in line
        rows = {r["system"]: r for r in json.loads((tmp_path / "rows.json").read_text())}
        assert "single keyless" not in rows and "single gone" not in rows, rows
        assert all(r["failed"] == 0 for r in rows.values()) and "n/a" not in out

        out, err = await _eval(env, tmp_path, str(tasks), "--name", f"{name}-all",
                               "--baselines", "single", "--include-unusable",
                               "--json", str(tmp_path / "all.json"))
    assert "left out" not in err
    rows = {r["system"]: r for r in json.loads((tmp_path / "all.json").read_text())}
    for agent in ("keyless", "gone"):
        row = rows[f"single {agent}"]
        assert (row["failed"], row["accuracy"], row["mean_reward"]) == (2, None, None), row
        [shown] = [ln for ln in out.splitlines() if f"single {agent}" in ln]
        accuracy, failed = [c.strip() for c in shown.split("│")[2:4]]
        assert (accuracy, failed) == ("n/a", "2"), shown
    assert rows["single alpha"]["failed"] == 0
    assert not rows[next(s for s in rows if s.startswith("best single"))]["failed"]
    words = " ".join(out.split())  # the note under the table wraps at the terminal's width
    assert "4 run(s) failed" in words and f"conductor batch report {name}-all" in words


async def test_run_eval_runs_an_eval_from_python_and_writes_its_report(
    agent_server, client: Client, settings: Settings, trace_store: TraceStore, tmp_path: Path,
) -> None:
    """The eval `conductor eval` runs, with no CLI: a ConductorClient is the EvalClient; the
    caller sees the batch submitted and its progress, and gets the rows and files back. With
    two repeats every system runs each task twice and its row counts both runs."""
    pool, task_file, _ = sim_setup(agent_server, tmp_path)
    agent_server.set_responder("conductor", lambda prompt: plan_json(("alpha", "Answer.", [])))
    tasks = load_tasks(str(task_file)).tasks[:1]
    agents = [a.id for a in pool.agents][:2]  # a small eval: 3 systems, 6 runs
    spec = EvalSpec(agents=agents, baselines=["single"], repeats=2)
    submitted: list[tuple[bool, int]] = []
    progress: list[tuple[int, int]] = []
    name = f"py-eval-{uuid.uuid4().hex[:6]}"
    async with running_worker(client, settings, pool):
        outcome = await run_eval(
            ConductorClient(client, settings, pool), lambda: contextlib.nullcontext(trace_store),
            name, tasks, spec, out_dir=tmp_path / "report", json_file=tmp_path / "rows.json",
            on_submitted=lambda started, runs: submitted.append((started, runs)),
            on_progress=lambda p: progress.append((p.done, p.total)), poll_s=0.1)
    runs = 2 * len(tasks) * (1 + len(agents))
    assert submitted == [(True, runs)]
    assert progress and progress[-1] == (runs, runs), progress
    assert (outcome.name, outcome.tasks, outcome.runs, outcome.suite_rows) == (
        name, len(tasks), runs, None)
    systems = {r.system for r in outcome.rows}
    assert {"conductor", *(f"single {a}" for a in agents)} < systems, systems
    assert all(r.tasks == 2 * len(tasks) and r.failed == 0 for r in outcome.rows), outcome.rows
    assert {p.name for p in outcome.written} >= {"results.json", "table.md"}
    assert all(p.is_file() for p in outcome.written)
    assert [r["system"] for r in json.loads((tmp_path / "rows.json").read_text())] == \
        [r.system for r in outcome.rows]


def test_a_random_plan_is_valid_and_the_same_for_the_same_seed() -> None:
    agents = ["a", "b", "c"]
    plans = [random_plan(agents, f"0\x1ftask-{i}") for i in range(200)]
    assert plans[7] == random_plan(agents, "0\x1ftask-7")
    assert {len(p.steps) for p in plans} == {1, 2, 3, 4, 5}
    for p in plans:
        for i, s in enumerate(p.steps):
            assert s.access == "all" or all(0 <= j < i for j in s.access)
            assert s.agent in agents
