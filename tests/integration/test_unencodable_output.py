"""Model text no encoder accepts (a lone surrogate from a JSON `\\ud800` escape) or that
PostgreSQL refuses (NUL) neither fails a step nor loses the trace."""

from __future__ import annotations

from temporalio.client import Client

from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.trace_store import TraceStore
from conductor_engine.runtime.client import ConductorClient
from tests.agent_server import Reply
from tests.conftest import make_pool, running_worker
from tests.plans import plan_json


async def test_a_lone_surrogate_or_nul_in_model_text_completes_the_run_with_its_trace(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings,
    trace_store: TraceStore,
) -> None:
    plan = plan_json(("gpt", "Answer.", []), ("claude", "Check.", "all"))
    agent_server.script("conductor", [Reply.ok("thinking \ud800 aloud\n" + plan)])
    agent_server.script("gpt", [Reply.ok("half \ud800 a pair and a \x00 NUL")])
    agent_server.script("claude", [Reply.ok("fine \udfff")])
    async with running_worker(client, settings, make_pool(agent_server)):
        res = await conductor.run(Task(id="surrogates", question="q"))
    assert res.status == "completed"
    assert res.answer == "fine \ufffd"
    assert res.steps[0].output == "half \ufffd a pair and a \x00 NUL"
    trace = await trace_store.get(res.workflow_id)
    assert trace is not None and trace.answer == "fine \ufffd"
    assert agent_server.calls("gpt") == 1, "no step is paid for twice"
