"""Durability: a worker process killed in the middle of a run; a new one finishes the run and
no step that had completed is called again (counted on the agent server)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

from conductor_engine.engine.runtime.client import ConductorClient
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.tasks.model import Task
from tests.agent_server import Reply
from tests.cli import CONDUCTOR
from tests.conftest import make_pool, write_pool
from tests.plans import plan_json


def start_worker(settings: Settings, pool_file: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "CONDUCTOR_TEMPORAL_ADDRESS": settings.address,
        "CONDUCTOR_TASK_QUEUE": settings.task_queue,
        "CONDUCTOR_POOL_FILE": str(pool_file),
        "CONDUCTOR_DATA_DIR": str(settings.data_dir),
        "CONDUCTOR_DATABASE_URL": settings.database_url or "",
    }
    return subprocess.Popen([*CONDUCTOR, "worker"], env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)


async def wait_for(predicate, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.05)


async def test_a_killed_worker_is_replaced_and_completed_steps_are_not_called_again(
    agent_server, conductor: ConductorClient, settings: Settings, tmp_path: Path
) -> None:
    agent_server.script("conductor", [Reply.ok(plan_json(
        ("gpt", "Step one.", []), ("claude", "Step two.", "all"), ("gemini", "Step three.", "all"),
    ))])
    agent_server.script("gpt", [Reply.ok("one")])
    agent_server.script("claude", [Reply.ok("two")])
    # The first call of step three hangs long enough for the worker to be killed under it.
    agent_server.script("gemini", [Reply.ok("lost").after(20), Reply.ok("three")])
    pool_file = write_pool(make_pool(agent_server, gemini={"timeout_s": 4.0}), tmp_path / "p.toml")
    log = tmp_path / "worker.log"

    first = start_worker(settings, pool_file, log)
    try:
        workflow_id = await conductor.submit(Task(question="three steps"))
        await wait_for(lambda: agent_server.calls("gemini") == 1)
        first.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        first.kill()
    second = start_worker(settings, pool_file, log)
    try:
        res = await asyncio.wait_for(conductor.result(workflow_id), timeout=60)
    finally:
        second.terminate()
        second.wait(timeout=20)

    assert res.answer == "three", log.read_text()[-2000:]
    assert agent_server.calls("conductor") == 1
    assert agent_server.calls("gpt") == 1 and agent_server.calls("claude") == 1
    assert agent_server.calls("gemini") == 2
    assert res.steps[2].attempts == 2
