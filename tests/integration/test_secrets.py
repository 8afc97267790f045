"""No secret reaches a workflow history or a trace, whatever quotes it: a base URL with a
password, a server that echoes a key or a connection string, the environment's own keys."""

from __future__ import annotations

import pytest
from temporalio.client import Client

from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.trace_store import TraceStore
from conductor_engine.runtime.client import ConductorClient, RunFailed
from tests.agent_server import Reply
from tests.conftest import make_pool, running_worker
from tests.plans import plan_json

ECHOED_KEY = "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv"
DB_PASSWORD = "db-hunter2-pass"


async def test_a_failing_agent_leaves_no_secret_in_history_or_trace(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings,
    trace_store: TraceStore,
) -> None:
    """The agent's base URL carries a password; its server answers 404 quoting that URL, a
    key, the agent's own key (from the environment) and a database URL with `?password=`."""
    agent_server.script("conductor", [Reply.ok(plan_json(("gpt", "Answer.", [])))])
    own_key = "sk-test-test_openai_key"  # what tests/conftest.py puts in TEST_OPENAI_KEY
    base_url = agent_server.openai_base_url.replace("://", "://proxyuser:url-pass-77@")
    agent_server.script("gpt", [Reply.error(404, (
        f"no model at {base_url}; key {ECHOED_KEY} / {own_key} is not valid for "
        f"postgresql://app@db:5432/c?sslmode=require&password={DB_PASSWORD}"))])
    pool = make_pool(agent_server, gpt={"base_url": base_url})
    async with running_worker(client, settings, pool):
        with pytest.raises(RunFailed) as caught:
            await conductor.run(Task(id="secret-echo", question="q"))
    workflow_id = caught.value.workflow_id
    history = (await client.get_workflow_handle(workflow_id).fetch_history()).to_json()
    trace = await trace_store.get(workflow_id)
    assert trace is not None and trace.status == "failed"
    for where, text in (("message", str(caught.value)), ("history", history),
                        ("trace", trace.model_dump_json())):
        for secret in ("url-pass-77", ECHOED_KEY, own_key, DB_PASSWORD):
            assert secret not in text, f"{secret!r} in the {where}"
    assert "proxyuser:***@" in history, "the URL is still there to read, without its password"
