"""Replay: recorded histories of ConductWorkflow must replay against the current code, so a
non-deterministic change (reordered activities, a new await, a changed child id) fails here
instead of breaking runs that are in flight in production.

Histories are named `<version>_<workflow>.json`. Keep old versions: runs started before a change
must still replay (the workflow guards changes with `workflow.patched`). Record a new version,
for a deliberate change only, with: python -m tests.integration.test_replay VERSION
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer

from conductor_engine.engine.runtime.client import ConductorClient
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.payloads import data_converter
from conductor_engine.engine.tasks.model import RunOptions, Task
from conductor_engine.workflows.conduct import ConductWorkflow
from tests.agent_server import AgentServer, Reply
from tests.conftest import make_pool, running_worker
from tests.plans import plan_json

HISTORIES = Path(__file__).parent / "histories"


def _conductor(prompt: str) -> str:
    if "Task:\nGather the facts." in prompt:
        return plan_json(("gpt", "List the two numbers.", []))
    if "Your plan in round 1" in prompt:
        return '{"steps": []}'
    if "not a valid plan" not in prompt:
        return "no plan here"  # the first attempt fails to parse, and is recorded
    return plan_json(("conductor", "Gather the facts.", []), ("claude", "Compute 2^10.", []),
                     ("gemini", "Compare and answer.", "all"))


async def record(
    client: Client, settings: Settings, server: AgentServer
) -> dict[str, WorkflowHistory]:
    """Run one workflow that exercises every path (a failed plan attempt, parallel steps, a
    self-call child, a refinement round ending in an empty plan) and return its histories."""
    server.set_responder("conductor", _conductor)
    server.script("gpt", [Reply.ok("1024 and 1000")])
    server.script("claude", [Reply.ok("1024")])
    server.script("gemini", [Reply.ok("2^10 is larger")])
    conductor = ConductorClient(client, settings)
    task = Task(id="replay", question="Which is larger, 2^10 or 10^3?", reference="2^10",
                verifier="exact", options=RunOptions(refinement_rounds=1))
    async with running_worker(client, settings, make_pool(server)):
        wid = await conductor.submit(task, workflow_id=f"replay-{settings.task_queue}")
        res = await conductor.result(wid)
    assert res.answer == "2^10 is larger" and res.steps[0].child_workflow_id
    out = {}
    for name, workflow_id in (("conduct", wid), ("conduct_child", res.steps[0].child_workflow_id)):
        out[name] = await client.get_workflow_handle(workflow_id).fetch_history()
    return out


async def test_recorded_histories_replay_on_the_current_workflow_code(tmp_path: Path) -> None:
    files = sorted(HISTORIES.glob("*.json"))
    assert files, "no recorded histories; run python -m tests.integration.test_replay"
    # the engine's converter, as every worker uses it (these histories hold no blob references)
    replayer = Replayer(workflows=[ConductWorkflow],
                        data_converter=data_converter(Settings(data_dir=tmp_path)))
    for path in files:
        saved = json.loads(path.read_text())
        history = WorkflowHistory.from_json(saved["workflow_id"], saved["history"])
        await replayer.replay_workflow(history)


async def test_a_fresh_run_replays_too(
    agent_server: AgentServer, client: Client, settings: Settings
) -> None:
    histories = await record(client, settings, agent_server)
    replayer = Replayer(workflows=[ConductWorkflow], data_converter=data_converter(settings))
    for history in histories.values():
        await replayer.replay_workflow(history)


async def _main(version: str) -> None:  # pragma: no cover - the re-recording entry point
    import os
    import tempfile

    from conductor_engine.engine.runtime.client import connect_temporal
    from conductor_engine.engine.runtime.embedded import EmbeddedTemporal
    from conductor_engine.engine.storage.database import EmbeddedPostgres
    from tests.agent_server import start_agent_server
    from tests.conftest import free_port

    for name in ("TEST_OPENAI_KEY", "TEST_ANTHROPIC_KEY", "TEST_GEMINI_KEY"):
        os.environ[name] = "sk-test-key"
    with tempfile.TemporaryDirectory() as tmp, start_agent_server() as server:
        Path(tmp).chmod(0o711)  # run as root, the embedded PostgreSQL's own user must enter it
        temporal = EmbeddedTemporal(Path(tmp), free_port(), free_port())
        temporal.start(detached=False)
        postgres = EmbeddedPostgres(Path(tmp))
        try:
            settings = Settings(temporal_address=f"127.0.0.1:{temporal.port}", task_queue="replay",
                                data_dir=Path(tmp), database_url=postgres.start())
            client = await connect_temporal(settings, start_embedded=False)
            for name, history in (await record(client, settings, server)).items():
                saved = {"workflow_id": history.workflow_id,
                         "history": json.loads(history.to_json())}
                (HISTORIES / f"{version}_{name}.json").write_text(json.dumps(saved, indent=1))
                print(f"recorded {version}_{name}")
        finally:
            from conductor_engine.engine.storage.shared import close_shared_stores

            await close_shared_stores()
            temporal.stop()
            postgres.stop()


if __name__ == "__main__":
    import sys

    asyncio.run(_main(sys.argv[1]))
