"""The main job with no API key: the real local model writes the plan (constrained JSON) and
answers every step, through the real Temporal dev server."""

from __future__ import annotations

import pytest
from temporalio.client import Client

from conductor_engine.engine.contracts.tasks import RunOptions, Task
from conductor_engine.engine.providers import local
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.trace_store import TraceStore
from conductor_engine.runtime.client import ConductorClient
from tests.conftest import running_worker

pytestmark = pytest.mark.slow


async def test_the_local_model_conducts_a_run_end_to_end_with_no_api_keys(
    first_load: local.LoadedModel,
    client: Client,
    settings: Settings,
    trace_store: TraceStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    pool = Pool.load()  # the shipped default pool
    assert {a.id for a in pool.available()} == {"smollm2"}  # no keys, no self-calls
    task = Task(
        question="Which is larger, 2^10 or 10^3? Explain briefly.", reference="1024",
        options=RunOptions(max_steps=2, self_call_depth=0, temperature=0.0),  # greedy: one plan
    )
    async with running_worker(client, settings, pool):
        res = await ConductorClient(client, settings).run(task)

    assert res.status == "completed", res.error
    attempt = res.rounds[0].attempts[0]
    assert attempt.plan is not None, "constrained decoding makes the first plan parse"
    assert attempt.token_ids and attempt.logprobs and len(attempt.token_ids) == len(
        attempt.logprobs)
    assert res.answer and res.answer == res.steps[-1].output
    assert all(s.usage.output_tokens > 0 for s in res.steps)
    # the trace keeps what the trainer needs: prompt, token ids, behaviour logprobs, reward
    trace = await trace_store.get(res.workflow_id)
    assert trace is not None and trace.reward is not None and trace.reward.value is not None
    assert trace.reward.value in (0.5, 1.0)  # a valid plan: wrong or right, never 0
    kept = trace.rounds[0].attempts[0]
    assert kept.prompt and kept.token_ids == attempt.token_ids and kept.logprobs
    assert trace.policy.name == "conductor" and trace.policy.version == "base"
