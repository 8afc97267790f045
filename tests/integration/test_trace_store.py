"""The trace store on real PostgreSQL (the embedded server) and real runs on the Temporal dev
server: migrations, idempotent upserts, group queries, traces read back whole."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio import activity
from temporalio.client import Client

from conductor_engine.activities.record import RecordActivities
from conductor_engine.engine.contracts.activities import RecordRequest
from conductor_engine.engine.contracts.names import RECORD_ACTIVITY, plans_task_queue
from conductor_engine.engine.contracts.records import RunResult
from conductor_engine.engine.contracts.rewards import Reward, Verdict
from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.contracts.tasks import RunOptions, SelfCallFrame, Task
from conductor_engine.engine.contracts.traces import PolicyRef, Trace
from conductor_engine.engine.rewards.rollouts import as_rollout
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.blobs import LocalBlobStore
from conductor_engine.engine.storage.database import _migrations, connect_pool, migrate
from conductor_engine.engine.storage.trace_store import TraceFilter, TraceStore
from conductor_engine.runtime.client import ConductorClient, RunFailed, task_queue_of
from tests.agent_server import Reply
from tests.cli import run_conductor
from tests.conftest import make_pool, running_worker, write_pool
from tests.plans import plan_json, self_calling_conductor
from tests.rollout_groups import read_groups
from tests.traces import make_trace


async def _fresh_database(postgres_url: str) -> str:
    """A new, empty database on the session's server, for tests that need one."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return postgres_url.replace("/postgres?", f"/{name}?")


async def test_migrations_apply_to_an_empty_database_once_even_when_raced(
    postgres_url: str,
) -> None:
    url = await _fresh_database(postgres_url)
    conns = [await asyncpg.connect(url) for _ in range(3)]
    try:
        shipped = len(_migrations())
        applied = await asyncio.gather(*(migrate(c) for c in conns))
        assert sorted(len(a) for a in applied) == [0, 0, shipped], "one connection applies all"
        assert await migrate(conns[0]) == [], "re-applying is a no-op"
        assert await conns[0].fetchval("SELECT count(*) FROM schema_migrations") == shipped
        assert await conns[0].fetchval("SELECT count(*) FROM traces") == 0
    finally:
        for c in conns:
            await c.close()


async def test_writing_a_trace_twice_keeps_one_row_and_reads_back_equal(
    trace_store: TraceStore,
) -> None:
    trace = make_trace(f"t-{uuid.uuid4().hex[:6]}")
    await trace_store.write(trace)
    await trace_store.write(trace)
    assert await trace_store.count(TraceFilter(task_id=trace.task.id)) == 1
    back = await trace_store.get(trace.workflow_id)
    assert back is not None and back.model_dump() == trace.model_dump()


async def test_a_served_plans_schema_reads_back_with_its_properties_in_order(
    trace_store: TraceStore,
) -> None:
    """The trainer reconstructs a served plan's records from the schema on its attempt, and the
    grammar writes properties in the schema's order; a jsonb object would come back with its
    keys reordered (`steps` before `reasoning`) and every reconstruction would reject the plan."""
    schema = {"type": "object", "properties": {"reasoning": {"type": "string"},
                                               "steps": {"type": "array"}},
              "required": ["reasoning", "steps"]}
    trace = make_trace(f"t-{uuid.uuid4().hex[:6]}")
    rnd = trace.rounds[0]
    attempt = rnd.attempts[0].model_copy(update={"json_schema": schema, "token_ids": [1, 2]})
    trace = trace.model_copy(update={"rounds": [rnd.model_copy(update={"attempts": [attempt]})]})
    await trace_store.write(trace)
    back = await trace_store.get(trace.workflow_id)
    assert back is not None
    read = back.rounds[0].attempts[0].json_schema
    assert read == schema and json.dumps(read) == json.dumps(schema)


async def test_long_texts_go_to_the_blob_store_and_come_back(
    postgres_url: str, tmp_path: Any,
) -> None:
    blobs = LocalBlobStore(tmp_path)
    store = await TraceStore.open(postgres_url, blobs, blob_threshold=1024, max_size=2)
    try:
        big = "x" * 5000
        trace = make_trace(f"t-{uuid.uuid4().hex[:6]}", output=big)
        await store.write(trace)
        raw = await store.pool.fetchval(
            "SELECT trace FROM traces WHERE workflow_id = $1", trace.workflow_id)
        stored = raw["rounds"][0]["steps"][2]["output"]
        assert stored["$blob"].startswith("sha256:") and stored["bytes"] == 5000
        assert await blobs.exists(stored["$blob"])
        back = await store.get(trace.workflow_id)
        assert back is not None and back.answer == big and back.steps[2].output == big
    finally:
        await store.close()


async def test_groups_are_complete_same_task_same_version_and_oldest_first(
    trace_store: TraceStore,
) -> None:
    version = f"v-{uuid.uuid4().hex[:6]}"
    start = datetime.now(UTC) - timedelta(hours=1)
    traces = []
    for k, (task_id, n) in enumerate([("a", 5), ("b", 4), ("c", 3)]):
        for i in range(n):
            traces.append(make_trace(f"{version}-{task_id}", version=version,
                                     reward=float(i % 2),
                                     finished=start + timedelta(minutes=k * 10 + i)))
    traces.append(make_trace(f"{version}-c", version="other"))  # another version: not in c
    # a failed run of task b later resumed (same workflow id, new run): only the new run counts
    failed = make_trace(f"{version}-b", version=version, reward=0.0,
                        finished=start + timedelta(minutes=50))
    resumed = failed.model_copy(update={"run_id": "resumed", "reward": traces[-2].reward,
                                        "finished_at": start + timedelta(minutes=55)})
    traces += [failed, resumed]
    for t in traces:
        await trace_store.write(t)

    groups = await read_groups(trace_store, PolicyRef(name="conductor", version=version), size=4)
    assert [g.task_id for g in groups] == [f"{version}-a", f"{version}-b"]
    assert all(len(g.traces) == 4 for g in groups)
    five = await read_groups(trace_store, PolicyRef(name="conductor", version=version), size=5)
    assert [len(g.traces) for g in five] == [5, 5], "b: 4 + the resumed run, not the failed one"
    assert all(t.run_id != failed.run_id for g in five for t in g.traces)
    first = groups[0].traces
    assert [t.finished_at for t in first] == sorted(t.finished_at for t in first)
    assert groups[0].rewards == [0.0, 1.0, 0.0, 1.0]
    assert [g.task_id for g in five] == [f"{version}-a", f"{version}-b"]
    assert await read_groups(trace_store, PolicyRef(name="conductor", version=version),
                             size=6) == []


async def test_analyst_filters_by_dataset_tag_version_reward_and_date(
    trace_store: TraceStore,
) -> None:
    dataset = f"ds-{uuid.uuid4().hex[:6]}"
    now = datetime.now(UTC)
    for i, r in enumerate([0.0, 0.5, 1.0, 1.0]):
        await trace_store.write(make_trace(f"{dataset}-{i}", dataset=dataset, reward=r,
                                           finished=now - timedelta(days=i)))
    by = TraceFilter(dataset=dataset)
    assert await trace_store.count(by) == 4
    assert await trace_store.count(by.model_copy(update={"min_reward": 1.0})) == 2
    assert await trace_store.count(by.model_copy(update={"max_reward": 0.0})) == 1
    assert await trace_store.count(by.model_copy(update={"tag": "math"})) == 4
    assert await trace_store.count(by.model_copy(update={"tag": "hard"})) == 0
    recent = by.model_copy(update={"since": now - timedelta(days=1, hours=1)})
    assert [r.task_id for r in await trace_store.search(recent)] == [f"{dataset}-0",
                                                                   f"{dataset}-1"]
    assert await trace_store.count(by.model_copy(update={"policy_version": "v2"})) == 0


async def test_a_retried_record_activity_leaves_one_trace(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings,
    trace_store: TraceStore, tmp_path: Path,
) -> None:
    """The first attempt writes the trace and then 'loses' its reply (the worker died after
    the commit); Temporal retries it, and the upsert keeps a single row."""

    class LossyRecord(RecordActivities):
        @activity.defn(name="record_trace")
        async def record(self, req: RecordRequest) -> None:
            await super().record(req)
            if activity.info().attempt == 1:
                raise RuntimeError("connection reset after commit")

    from temporalio.worker import Worker

    from conductor_engine.activities.agent import AgentActivities
    from conductor_engine.activities.plan import PlanActivities
    from conductor_engine.activities.score import score
    from conductor_engine.workflows.conduct import ConductWorkflow

    agent_server.script("conductor", [Reply.ok(plan_json(("gpt", "Compute 2^10.", [])))])
    agent_server.script("gpt", [Reply.ok("1024")])
    pool = make_pool(agent_server)
    settings.pool_file = write_pool(pool, tmp_path / "pool.toml")  # the client's pool
    queue = task_queue_of(settings, pool)
    worker = Worker(
        client, task_queue=queue, workflows=[ConductWorkflow],
        activities=[AgentActivities(pool).call_agent, score,
                    LossyRecord(settings, pool, trace_store).record],
    )
    planner = Worker(client, task_queue=plans_task_queue(queue),
                     activities=[PlanActivities(pool).write_plan])
    async with planner, worker:
        res = await conductor.run(Task(question="What is 2^10?", reference="1024"))
        history = await client.get_workflow_handle(res.workflow_id).fetch_history()

    record_attempts = [
        e.activity_task_started_event_attributes.attempt for e in history.events
        if e.HasField("activity_task_started_event_attributes")
    ]
    assert max(record_attempts) == 2, "the record activity ran twice"
    assert await trace_store.count(TraceFilter(task_id=res.task_id)) == 1
    trace = await trace_store.get(res.workflow_id)
    assert trace is not None and trace.reward is not None and trace.reward.value == 1.0


async def test_a_self_call_and_a_refinement_round_read_back_whole(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings,
    trace_store: TraceStore,
) -> None:
    calls = {"n": 0}

    def conductor_model(prompt: str) -> str:
        if "Task:\nFind the two numbers." in prompt:
            return self_calling_conductor(prompt)
        calls["n"] += 1
        return self_calling_conductor(prompt) if calls["n"] == 1 else '{"steps": []}'

    agent_server.set_responder("conductor", conductor_model)
    agent_server.script("gpt", [Reply.ok("1024 and 1000")])
    agent_server.script("claude", [Reply.ok("1024 is larger")])
    from tests.conftest import running_worker

    async with running_worker(client, settings, make_pool(agent_server)):
        res = await conductor.run(Task(question="Which is larger?", reference="1024 is larger",
                                       verifier="exact", dataset="demo", tags=["cmp"],
                                       options=RunOptions(refinement_rounds=1)))
    trace = await trace_store.get(res.workflow_id)
    assert trace is not None
    assert len(trace.rounds) == 2 and trace.rounds[1].plan is not None
    assert trace.rounds[1].plan.steps == []
    assert trace.answer == "1024 is larger" and trace.reward is not None
    assert trace.reward.value == 1.0 and trace.task.dataset == "demo"
    assert trace.policy == PolicyRef(name="conductor", version="base")
    assert trace.rounds[0].attempts[0].prompt, "the conductor's prompt is kept for training"
    [child] = trace.children
    assert child.parent_workflow_id == res.workflow_id and child.depth == 1
    assert child.answer == "1024 and 1000" and child.steps[0].agent == "gpt"
    assert child.reward is None, "a self-call has no reference of its own"
    assert trace.steps[0].child_workflow_id == child.workflow_id


async def test_failed_and_unparseable_runs_are_recorded_with_reward_zero(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings,
    trace_store: TraceStore,
) -> None:
    from tests.conftest import running_worker

    agent_server.script("conductor", [
        Reply.ok("no plan here"),
        Reply.ok(plan_json(("gpt", "Compute 2^10.", []))),
    ])
    agent_server.script("gpt", [Reply.error(401, "bad key")])
    async with running_worker(client, settings, make_pool(agent_server)):
        invalid = await conductor.run(Task(question="q", reference="1024",
                                           options=RunOptions(max_plan_attempts=1)))
        try:
            await conductor.run(Task(id=f"fails-{uuid.uuid4().hex[:6]}", question="q",
                                     reference="1024"))
            raise AssertionError("the run should fail")
        except RunFailed as e:
            failed_id = e.workflow_id
    bad = await trace_store.get(invalid.workflow_id)
    assert bad is not None and bad.status == "invalid_plan" and bad.reward is not None
    assert bad.reward.value == 0.0 and bad.rounds[0].attempts[0].raw_text == "no plan here"
    failed = await trace_store.get(failed_id)
    assert failed is not None and failed.status == "failed" and failed.reward is not None
    assert failed.reward.value == 0.0 and "gpt" in (failed.error or "")
    assert failed.steps[0].status == "failed" and failed.steps[0].error
    # what failed is recorded, so training leaves the run out of its group instead of a zero
    assert failed.failure == "StepFailed" and as_rollout(failed) == "step_failed"
    assert as_rollout(bad) == bad, "an unparseable plan is the policy's own: a rollout"


async def test_group_fetch_uses_the_group_index(postgres_url: str) -> None:
    pool = await connect_pool(postgres_url, max_size=1)
    try:
        async with pool.acquire() as conn:
            await conn.execute("SET enable_seqscan = off")
            rows = await conn.fetch(
                "EXPLAIN SELECT task_id FROM traces WHERE depth = 0 AND NOT superseded "
                "AND policy_name = 'c' AND policy_version = 'v' GROUP BY task_id")
        assert "traces_groups" in "\n".join(r[0] for r in rows)
    finally:
        await pool.close()


# --- content that looks like a blob reference, and groups of honest rollouts --------------

REF = "sha256:" + "ab" * 32


def forged_trace(task_id: str, **kw: Any) -> Trace:
    """A trace whose content imitates the store's blob references: in a verifier's details (as
    a forged sandbox event carried them) and in a step's output, short and long."""
    trace = make_trace(task_id, **kw)
    assert trace.reward is not None and trace.reward.verdict is not None
    trace.reward.verdict.details = {
        "events": [{"$blob": "sha256:../../../../etc/passwd"},
                   {"$blob": REF, "bytes": 4, "preview": "pwnd"}, 7, [{"$$blob": None}]],
        "$blob": "sha256:..", "$$blob": {"$blob": REF}, "extracted": "1024"}
    forged = json.dumps({"$blob": "sha256:../..", "bytes": 1, "preview": "x"})
    trace.rounds[0].steps[0].output = forged
    trace.rounds[0].steps[1].output = forged + " " + "y" * 3000  # long: a real blob
    return trace


@pytest.mark.parametrize("threshold", [1024, 64 * 1024])
async def test_trace_content_that_looks_like_a_blob_reference_round_trips_exactly(
    postgres_url: str, tmp_path: Path, threshold: int,
) -> None:
    blobs = LocalBlobStore(tmp_path / "blobs")
    store = await TraceStore.open(postgres_url, blobs, blob_threshold=threshold, max_size=2)
    try:
        trace = forged_trace(f"forged-{uuid.uuid4().hex[:6]}")
        await store.write(trace)
        raw = await store.pool.fetchval(
            "SELECT trace FROM traces WHERE workflow_id = $1", trace.workflow_id)
        details = raw["reward"]["verdict"]["details"]
        assert raw["$escaped"] == 1 and "$blob" not in details and details["$$blob"] == "sha256:.."
        assert details["$$$blob"] == {"$$blob": REF}
        back = await store.get(trace.workflow_id)
        assert back is not None and back.model_dump() == trace.model_dump()
        made = [p for p in (tmp_path / "blobs").rglob("*") if p.is_file()]
        assert len(made) == (1 if threshold == 1024 else 0), "only the long output is a blob"
    finally:
        await store.close()


async def test_conductor_traces_show_prints_a_trace_with_forged_references(
    trace_store: TraceStore, base_settings: Settings,
) -> None:
    trace = forged_trace(f"show-{uuid.uuid4().hex[:6]}")
    await trace_store.write(trace)
    env = {"CONDUCTOR_DATABASE_URL": base_settings.database_url or "",
           "CONDUCTOR_DATA_DIR": str(base_settings.data_dir)}
    shown = run_conductor("traces", "show", trace.workflow_id, "--full", env=env)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert trace.workflow_id in shown.stdout and "sha256:../.." in shown.stdout
    as_json = run_conductor("traces", "show", trace.workflow_id, "--json", env=env)
    assert as_json.returncode == 0, as_json.stderr
    assert Trace.model_validate_json(as_json.stdout).model_dump() == trace.model_dump()


def _failed(trace: Trace, failure: str) -> Trace:
    return trace.model_copy(update={
        "status": "failed", "failure": failure, "answer": None,
        "error": f"step 1/3 (gpt) failed: HTTP 500 ({failure})",
        "reward": Reward(value=0.0, reason="run failed")})


def _verifier_error(trace: Trace) -> Trace:
    verdict = Verdict(verifier="code", correct=False, score=0.0, reason="verifier error: boom",
                      details={"error": "sandbox exited 137"})
    return trace.model_copy(update={
        "reward": Reward(value=0.0, verdict=verdict, reason="verifier error: boom")})


async def test_a_group_leaves_out_failed_unreadable_and_unverified_runs_and_counts_them(
    postgres_url: str, tmp_path: Path,
) -> None:
    """Six runs finished: the group is complete. Three are rollouts (one with forged
    references in its verdict, read back exactly); a step that failed, a verifier that failed
    and a trace whose blob is gone are left out, each with its reason, and the trainer's group
    read neither fails nor scores them 0."""
    blobs = LocalBlobStore(tmp_path / "blobs")
    store = await TraceStore.open(postgres_url, blobs, blob_threshold=1024, max_size=2)
    name, task = f"honest-{uuid.uuid4().hex[:6]}", "t-honest"
    start = datetime.now(UTC) - timedelta(hours=1)

    def run(i: int, reward: float, **kw: Any) -> Trace:
        t = make_trace(task, version="v1", reward=reward, finished=start + timedelta(minutes=i),
                       **kw)
        return t.model_copy(update={"policy": PolicyRef(name=name, version="v1")})

    forged = forged_trace(task, version="v1", reward=0.5, finished=start + timedelta(minutes=1))
    forged = forged.model_copy(update={"policy": PolicyRef(name=name, version="v1")})
    lost = run(5, 1.0, output="z" * 5000)  # its answer goes to a blob, which is then lost
    runs = [run(0, 1.0), forged, _failed(run(2, 1.0), "StepFailed"), run(3, 1.0),
            _verifier_error(run(4, 1.0)), lost]
    try:
        for t in runs:
            await store.write(t)
        for path in (tmp_path / "blobs").rglob("*"):
            if path.is_file() and path.read_bytes() == b"z" * 5000:
                path.unlink()
        policy = PolicyRef(name=name, version="v1")
        assert await read_groups(store, policy, size=7) == [], "complete once all G have finished"
        [group] = await read_groups(store, policy, size=6)
        assert [t.workflow_id for t in group.traces] == [runs[i].workflow_id for i in (0, 1, 3)]
        assert group.rewards == [1.0, 0.5, 1.0] and group.trainable
        assert group.traces[1].model_dump() == forged.model_dump()
        assert {(x.workflow_id, x.reason) for x in group.left_out} == {
            (runs[2].workflow_id, "step_failed"), (runs[4].workflow_id, "verifier_error"),
            (lost.workflow_id, "unreadable")}
        assert any("BlobNotFound" in (x.detail or "") for x in group.left_out)
        assert sorted(group.runs) == sorted((t.workflow_id, t.run_id) for t in runs)

        from conductor_engine.engine.contracts.training import RolloutConfig
        from conductor_engine.trainer.rollouts import group_stats, select_groups

        cfg = RolloutConfig(group_size=6, groups_per_update=1, max_staleness=0)
        picked = await select_groups(store, name, 1, cfg)
        stats = group_stats(picked)
        assert (stats.groups, stats.rollouts) == (1, 3)
        assert stats.mean_reward == pytest.approx(2.5 / 3)
        assert stats.left_out == {"step_failed": 1, "unreadable": 1, "verifier_error": 1}
    finally:
        await store.close()


async def test_a_group_too_small_to_train_is_taken_with_the_next_that_trains(
    trace_store: TraceStore,
) -> None:
    name = f"small-{uuid.uuid4().hex[:6]}"
    start = datetime.now(UTC) - timedelta(hours=1)

    def run(task: str, i: int, reward: float = 1.0) -> Trace:
        t = make_trace(task, version="v1", reward=reward, finished=start + timedelta(minutes=i))
        return t.model_copy(update={"policy": PolicyRef(name=name, version="v1")})

    dead = [run("a", 0), _failed(run("a", 1), "PlanFailed"), _failed(run("a", 2), "StepFailed")]
    live = [run("b", 3, 1.0), run("b", 4, 0.5), _failed(run("b", 5), "StepFailed")]
    for t in dead + live:
        await trace_store.write(t)
    from conductor_engine.engine.contracts.training import RolloutConfig
    from conductor_engine.trainer.rollouts import group_stats, select_groups

    cfg = RolloutConfig(group_size=3, groups_per_update=1, max_staleness=0)
    picked = await select_groups(trace_store, name, 1, cfg)
    assert [(g.task_id, g.trainable) for g, _ in picked] == [("a", False), ("b", True)]
    stats = group_stats(picked)
    assert (stats.groups, stats.rollouts, stats.mean_reward) == (1, 2, 0.75)
    assert stats.left_out == {"step_failed": 2, "plan_failed": 1, "too_few_left": 1}


# --- text PostgreSQL cannot hold, and rows it refuses ----------------------------------------


UNSTORABLE = "a\x00b\ud800c \\u0000 kept \ud83d\ude00 \udfff"
"""NUL, lone surrogates, a pair written as two characters, and text spelling `\\u0000`."""


async def test_text_postgres_cannot_hold_is_written_and_reads_back_exactly(
    trace_store: TraceStore,
) -> None:
    """jsonb refuses NUL, and no UTF-8 encoder takes a lone surrogate (a JSON reply's
    `\\ud800` escape decodes to one): such text used to fail the write on every retry for a
    day and lose the trace. It goes to the blob store, short or long, and reads back exactly."""
    trace = make_trace(f"odd-{uuid.uuid4().hex[:6]}", output=UNSTORABLE)
    trace.rounds[0].attempts[0].raw_text = "plan\ud800\x00"
    trace.rounds[0].steps[0].output = "\x00"
    await trace_store.write(trace)
    back = await trace_store.get(trace.workflow_id)
    assert back is not None and back.model_dump() == trace.model_dump()
    assert back.answer == UNSTORABLE and back.steps[0].output == "\x00"
    raw = await trace_store.pool.fetchval(
        "SELECT trace FROM traces WHERE workflow_id = $1", trace.workflow_id)
    stored = raw["rounds"][0]["steps"][2]["output"]
    assert stored["preview"] == "a\ufffdb\ufffdc \\u0000 kept \U0001f600 \ufffd", (
        "a reader of the row alone sees U+FFFD where the blob holds the exact text")
    assert raw["rounds"][0]["steps"][1]["output"] == trace.steps[1].output, "others stay inline"


async def test_ids_and_keys_postgres_cannot_hold_are_written_with_replacements(
    trace_store: TraceStore,
) -> None:
    """Columns and dict keys cannot be blobs: there (only) NUL and lone surrogates become
    U+FFFD. The engine refuses such ids and tags where they enter; the store still writes a
    trace that got past that, findable by its id as written or as stored."""
    task_id = f"odd-{uuid.uuid4().hex[:6]}-\x00-\ud800"
    trace = make_trace(task_id)
    trace.task.tags = ["t\x00ag", "\udfff"]
    assert trace.reward is not None and trace.reward.verdict is not None
    trace.reward.verdict.details = {"k\x00": "v\x00"}
    await trace_store.write(trace)
    stored_id = task_id.replace("\x00", "\ufffd").replace("\ud800", "\ufffd")
    assert await trace_store.count(TraceFilter(task_id=stored_id)) == 1
    assert await trace_store.count(TraceFilter(task_id=task_id)) == 1
    assert await trace_store.count(TraceFilter(tag="t\x00ag")) >= 1
    back = await trace_store.get(trace.workflow_id)
    assert back is not None and back.task.id == task_id, "the document keeps the exact id"
    assert back.task.tags == ["t\x00ag", "\udfff"]
    assert back.reward is not None and back.reward.verdict is not None
    assert back.reward.verdict.details == {"k\ufffd": "v\x00"}


async def test_a_run_whose_agents_answer_nul_and_lone_surrogates_leaves_its_whole_trace(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings,
    trace_store: TraceStore,
) -> None:
    """On the real servers: the trace holds every step as the run returned it. A NUL is kept
    exactly; a lone surrogate is U+FFFD from where the reply enters (engine/text.py
    `encodable`: it could not cross Temporal's data converter otherwise)."""
    agent_server.script("conductor", [Reply.ok(plan_json(
        ("gpt", "Answer.", []), ("claude", "Check.", "all")))])
    agent_server.script("gpt", [Reply.ok("\x00")])
    agent_server.script("claude", [Reply.ok("ok \ud800 and \x00 done")])
    async with running_worker(client, settings, make_pool(agent_server)):
        res = await conductor.run(Task(question="q"))
    assert [s.output for s in res.steps] == ["\x00", "ok \ufffd and \x00 done"]
    trace = await trace_store.get(res.workflow_id)
    assert trace is not None and trace.status == "completed"
    assert [s.output for s in trace.steps] == ["\x00", "ok \ufffd and \x00 done"]
    assert trace.rounds == res.rounds and trace.answer == res.answer


async def test_a_trace_postgres_refuses_fails_the_record_activity_once(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings,
    trace_store: TraceStore,
) -> None:
    """A row that breaks a constraint can never be written: the record activity fails once,
    non-retryable (TraceRejected, with one clear message), instead of being retried for the
    record deadline (a day). The run still returns its answer. The constraint is a real one,
    added for this test's task id only."""
    task_id = f"refused-{uuid.uuid4().hex[:6]}"
    constraint = f"test_refuses_{task_id.replace('-', '_')}"
    await trace_store.pool.execute(
        f"ALTER TABLE traces ADD CONSTRAINT {constraint} CHECK (task_id <> '{task_id}') NOT VALID")
    try:
        agent_server.script("conductor", [Reply.ok(plan_json(("gpt", "Compute 2^10.", [])))])
        agent_server.script("gpt", [Reply.ok("1024")])
        async with running_worker(client, settings, make_pool(agent_server)):
            run = conductor.run(Task(id=task_id, question="What is 2^10?"))
            res = await asyncio.wait_for(run, timeout=60)  # retried, it would wait for a day
            history = await client.get_workflow_handle(res.workflow_id).fetch_history()
    finally:
        await trace_store.pool.execute(f"ALTER TABLE traces DROP CONSTRAINT {constraint}")
    assert res.status == "completed" and res.answer == "1024"
    record = {e.event_id for e in history.events
              if e.HasField("activity_task_scheduled_event_attributes")
              and e.activity_task_scheduled_event_attributes.activity_type.name == RECORD_ACTIVITY}
    attempts = [e.activity_task_started_event_attributes.attempt for e in history.events
                if e.HasField("activity_task_started_event_attributes")
                and e.activity_task_started_event_attributes.scheduled_event_id in record]
    failures = [e.activity_task_failed_event_attributes.failure for e in history.events
                if e.HasField("activity_task_failed_event_attributes")
                and e.activity_task_failed_event_attributes.scheduled_event_id in record]
    assert attempts == [1], "a refused row is not retried"
    assert len(failures) == 1
    info = failures[0].application_failure_info
    assert info.type == "TraceRejected" and info.non_retryable
    assert "IntegrityConstraintViolation" in failures[0].message or \
        "CheckViolation" in failures[0].message
    assert res.workflow_id in failures[0].message and "not written" in failures[0].message
    assert await trace_store.count(TraceFilter(task_id=task_id)) == 0


async def test_a_row_postgres_refuses_for_good_is_a_non_retryable_trace_rejected(
    agent_server: Any, trace_store: TraceStore, settings: Settings,
) -> None:
    from temporalio.exceptions import ApplicationError
    from temporalio.testing import ActivityEnvironment

    trace = make_trace(f"big-{uuid.uuid4().hex[:6]}")
    req = RecordRequest(task=revised(trace.task, frame=SelfCallFrame(depth=2**40)),  # bigint
                        result=_result_of(trace), started_at=trace.started_at,
                        finished_at=trace.finished_at)
    record = RecordActivities(settings, make_pool(agent_server), trace_store).record
    with pytest.raises(ApplicationError) as raised:
        await ActivityEnvironment().run(record, req)
    assert raised.value.type == "TraceRejected" and raised.value.non_retryable
    assert trace.workflow_id in str(raised.value) and "not written" in str(raised.value)


async def test_an_unreachable_trace_store_stays_retryable(
    agent_server: Any, postgres_url: str, tmp_path: Path, settings: Settings,
) -> None:
    from temporalio.exceptions import ApplicationError
    from temporalio.testing import ActivityEnvironment

    store = await TraceStore.open(postgres_url, LocalBlobStore(tmp_path), max_size=1)
    await store.close()  # as a server that went away leaves it
    trace = make_trace(f"down-{uuid.uuid4().hex[:6]}")
    req = RecordRequest(task=trace.task, result=_result_of(trace), started_at=trace.started_at,
                        finished_at=trace.finished_at)
    record = RecordActivities(settings, make_pool(agent_server), store).record
    with pytest.raises(ApplicationError) as raised:
        await ActivityEnvironment().run(record, req)
    assert raised.value.type == "TraceStoreUnavailable" and not raised.value.non_retryable


def _result_of(trace: Trace) -> RunResult:
    """The run result a trace was recorded from, as the record activity receives it."""
    return RunResult(task_id=trace.task.id, workflow_id=trace.workflow_id, run_id=trace.run_id,
                     status=trace.status, answer=trace.answer, rounds=trace.rounds,
                     totals=trace.totals, reward=trace.reward)
