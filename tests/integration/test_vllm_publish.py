"""A published policy version reaches a vLLM-served conductor: the plan activity writes the
version's adapter into the LoRA directory and loads it into vLLM (runtime LoRA) once, then plans
with `NAME-vK`. The scripted agent server answers the LoRA routes and completions as vLLM does;
Temporal and PostgreSQL are real."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import httpx
import pytest
from temporalio.client import Client

from conductor_engine.activities.plan import PlanActivities
from conductor_engine.engine.contracts.tasks import RunOptions, Task
from conductor_engine.engine.providers.base import AgentCallError
from conductor_engine.engine.providers.pool import AgentSpec, Pool
from conductor_engine.engine.providers.serving import LORA_PATH_NOT_FOUND, ensure_lora_adapter
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.policies import PolicyRegistry, PolicyVersion
from conductor_engine.engine.storage.trace_store import TraceStore
from conductor_engine.runtime.client import ConductorClient, RunFailed
from tests.agent_server import AgentServer, Reply
from tests.conftest import make_pool, running_worker
from tests.plans import plan_json


async def _publish_v1(store: TraceStore, name: str) -> PolicyVersion:
    """Version 1 of policy `name`, as the trainer publishes a LoRA update."""
    files = {
        "adapter_model.safetensors": await store.blobs.put(b"lora weights " + name.encode()),
        "adapter_config.json": await store.blobs.put(json.dumps({"r": 16}).encode()),
    }
    return await PolicyRegistry(store.pool).publish(PolicyVersion(
        name=name, version=1, parent=0, base_model="Qwen/Qwen2.5-7B-Instruct", kind="lora",
        files=files, update_id=f"{name}/update-1"), [])


@pytest.fixture
async def policy(trace_store: TraceStore) -> str:
    """A conductor id with version v1 published (a fresh name: loads are remembered per
    process, and the session's tests share one)."""
    name = f"cond-{uuid.uuid4().hex[:8]}"
    await _publish_v1(trace_store, name)
    return name


@pytest.fixture
def lora_settings(settings: Settings, tmp_path: Path) -> Settings:
    return settings.model_copy(update={"lora_dir": tmp_path / "lora"})


def _pool(server: AgentServer, name: str) -> Pool:
    """The test pool with a vLLM-served conductor named `name`, following 'latest'."""
    return make_pool(server, conductor={"id": name, "model": "Qwen/Qwen2.5-7B-Instruct",
                                        "api_key_env": "TEST_OPENAI_KEY"})


async def test_a_published_version_is_loaded_into_vllm_once_and_plans_are_recorded_as_v1(
    agent_server: AgentServer, client: Client, lora_settings: Settings, policy: str,
) -> None:
    agent_server.vllm_lora(load_delay_s=0.5)  # concurrent plans arrive while it loads
    agent_server.script(f"{policy}-v1", [Reply.ok(plan_json(("gpt", "Answer.", [])))])
    agent_server.script("gpt", [Reply.ok("42")])
    conductor = ConductorClient(client, lora_settings)
    async with running_worker(client, lora_settings, _pool(agent_server, policy)):
        results = await asyncio.gather(*(conductor.run(Task(question=f"q{i}")) for i in range(4)))

    assert [r.status for r in results] == ["completed"] * 4
    assert all(r.answer == "42" for r in results)
    assert {r.rounds[0].attempts[0].policy_version for r in results} == {"v1"}
    loads = agent_server.lora_calls("load")
    assert len(loads) == 1, f"one load for four concurrent plans, got {loads}"
    where = lora_settings.lora_root / policy / "v1"
    assert loads[0].lora_name == f"{policy}-v1" and loads[0].lora_path == str(where.resolve())
    assert loads[0].api_key == "sk-test-test_openai_key", "vLLM's --api-key guards the route"
    assert sorted(p.name for p in where.iterdir() if not p.name.startswith(".")) == [
        "adapter_config.json", "adapter_model.safetensors"]
    assert agent_server.calls(f"{policy}-v1") == 4
    assert agent_server.calls("Qwen/Qwen2.5-7B-Instruct") == 0, "the base model planned nothing"


async def test_a_server_without_runtime_lora_fails_the_plan_at_once_saying_how_to_start_vllm(
    agent_server: AgentServer, client: Client, lora_settings: Settings, policy: str,
) -> None:
    agent_server.vllm_lora(runtime_updating=False)
    conductor = ConductorClient(client, lora_settings)
    async with running_worker(client, lora_settings, _pool(agent_server, policy)):
        with pytest.raises(RunFailed) as failed:
            await conductor.run(Task(question="q"))

    reason = failed.value.reason
    assert "planning round 1 failed" in reason
    assert "--enable-lora" in reason and "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in reason
    assert len(agent_server.lora_calls("load")) == 1, "not retried: only a restart of vLLM helps"
    assert agent_server.calls() == 0


async def test_an_adapter_vllm_already_holds_counts_as_loaded(
    agent_server: AgentServer, lora_settings: Settings, policy: str,
) -> None:
    plans = PlanActivities(_pool(agent_server, policy), lora_settings)
    where = lora_settings.lora_root / policy / "v1"
    where.mkdir(parents=True)
    async with httpx.AsyncClient() as http:  # another worker (or process) loaded it first
        await http.post(f"{agent_server.url}/v1/load_lora_adapter",
                        json={"lora_name": f"{policy}-v1", "lora_path": str(where)})

    spec, label = await plans.conductor_at(None)

    assert (spec.model, label) == (f"{policy}-v1", "v1")
    assert [c.status for c in agent_server.lora_calls("load")] == [200, 400], (
        "the second is vLLM's 'has already been loaded' answer")
    await plans.conductor_at("v1")
    assert len(agent_server.lora_calls("load")) == 2, "remembered as loaded"


async def test_a_lora_dir_vllm_cannot_read_names_the_setting_and_is_not_retried(
    agent_server: AgentServer, trace_store: TraceStore, tmp_path: Path,
) -> None:
    name = f"cond-{uuid.uuid4().hex[:8]}"
    version = await _publish_v1(trace_store, name)
    spec = _pool(agent_server, name).conductor

    with pytest.raises(AgentCallError) as failed:
        await ensure_lora_adapter(spec, version, tmp_path / "only-on-the-worker")

    assert failed.value.kind == LORA_PATH_NOT_FOUND and not failed.value.retryable
    assert "No adapter found" in failed.value.message
    assert "CONDUCTOR_LORA_DIR" in failed.value.message
    assert "sk-test" not in failed.value.message


async def test_a_vllm_restart_that_lost_the_adapter_loads_it_again_on_the_next_attempt(
    agent_server: AgentServer, client: Client, lora_settings: Settings, policy: str,
) -> None:
    agent_server.script(f"{policy}-v1", [Reply.ok(plan_json(("gpt", "Answer.", [])))])
    agent_server.script("gpt", [Reply.ok("42")])
    conductor = ConductorClient(client, lora_settings)
    async with running_worker(client, lora_settings, _pool(agent_server, policy)):
        assert (await conductor.run(Task(question="q"))).status == "completed"
        agent_server.drop_adapters()  # vLLM restarted
        again = await conductor.run(Task(question="q", options=RunOptions(max_plan_attempts=1)))

    assert again.status == "completed" and again.rounds[0].attempts[0].policy_version == "v1"
    assert len(agent_server.lora_calls("load")) == 2
    assert agent_server.adapters() == {f"{policy}-v1": str((lora_settings.lora_root / policy /
                                                            "v1").resolve())}


async def test_a_vllm_that_is_down_is_retried(trace_store: TraceStore) -> None:
    name = f"cond-{uuid.uuid4().hex[:8]}"
    version = await _publish_v1(trace_store, name)
    spec = AgentSpec(id=name, provider="openai-compatible", model="Qwen/Qwen2.5-7B-Instruct",
                     base_url="http://127.0.0.1:1/v1")

    with pytest.raises(AgentCallError, match="could not reach http://127.0.0.1:1/v1") as failed:
        await ensure_lora_adapter(spec, version, Path("/nowhere"))

    assert failed.value.retryable
