"""The policy registry on real PostgreSQL: versions form a line, publishing is idempotent per
update, and no trace is trained on twice; the plan activity serves the version it should."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from conductor_engine.activities.plan import PlanActivities
from conductor_engine.engine.contracts.traces import PolicyRef
from conductor_engine.engine.providers.pool import AgentSpec, Pool
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.policies import (
    PolicyError,
    PolicyRegistry,
    PolicyVersion,
    StaleParent,
    TraceAlreadyConsumed,
    materialise,
    served_name,
)
from conductor_engine.engine.storage.trace_store import TraceStore
from tests.agent_server import AgentServer
from tests.rollout_groups import read_groups
from tests.traces import make_trace


def _name() -> str:
    return f"policy-{uuid.uuid4().hex[:8]}"


async def _version(store: TraceStore, name: str, version: int, update_id: str | None = None,
                   data: bytes = b"weights") -> PolicyVersion:
    ref = await store.blobs.put(data + name.encode() + bytes([version]))
    return PolicyVersion(name=name, version=version, parent=version - 1,
                         base_model="base-model", kind="lora",
                         files={"adapter_model.safetensors": ref},
                         update_id=update_id or f"{name}/update-{version}",
                         metrics={"loss": 0.5})


async def _stored_traces(store: TraceStore, name: str, n: int) -> list[tuple[str, str]]:
    keys = []
    task = f"task-{uuid.uuid4().hex[:6]}"
    for _ in range(n):
        trace = make_trace(task, version="base")
        trace.policy = PolicyRef(name=name, version="base")
        await store.write(trace)
        keys.append((trace.workflow_id, trace.run_id))
    return keys


def test_a_served_version_is_named_after_its_label() -> None:
    assert served_name("conductor", 2) == "conductor-v2"
    assert served_name("conductor", 0) == "conductor"


async def test_publishing_consumes_the_traces_once_and_a_retry_returns_the_same_version(
    trace_store: TraceStore,
) -> None:
    registry, name = PolicyRegistry(trace_store.pool), _name()
    keys = await _stored_traces(trace_store, name, 4)
    before = await read_groups(trace_store, PolicyRef(name=name), size=4, unconsumed=True)
    assert len(before) == 1
    v1 = await registry.publish(await _version(trace_store, name, 1), keys)
    assert (v1.version, v1.parent, v1.label) == (1, 0, "v1")
    assert await registry.latest_version(name) == 1
    assert sorted(await registry.consumed_by(v1.update_id)) == sorted(keys)
    assert await read_groups(trace_store, PolicyRef(name=name), size=4, unconsumed=True) == []
    assert len(await read_groups(trace_store, PolicyRef(name=name), size=4)) == 1, "kept for audit"
    again = await registry.publish(await _version(trace_store, name, 1), keys)
    assert again.version == 1 and await registry.latest_version(name) == 1


async def test_an_update_whose_traces_were_taken_publishes_nothing(
    trace_store: TraceStore,
) -> None:
    registry, name = PolicyRegistry(trace_store.pool), _name()
    keys = await _stored_traces(trace_store, name, 3)
    await registry.publish(await _version(trace_store, name, 1), keys[:2])
    with pytest.raises(TraceAlreadyConsumed, match="1 of the 2 traces"):
        await registry.publish(await _version(trace_store, name, 2), keys[1:])
    assert await registry.latest_version(name) == 1
    assert await registry.consumed_by(f"{name}/update-2") == [], "rolled back whole"


async def test_versions_form_a_line_so_a_stale_parent_is_refused(
    trace_store: TraceStore,
) -> None:
    registry, name = PolicyRegistry(trace_store.pool), _name()
    await registry.publish(await _version(trace_store, name, 1), [])
    stale = (await _version(trace_store, name, 1)).model_copy(update={"update_id": "other"})
    with pytest.raises(StaleParent, match="run one trainer per policy"):
        await registry.publish(stale, [])
    with pytest.raises(PolicyError, match="has no version v5"):
        await registry.get(name, 5)


async def test_a_version_materialises_as_a_directory_once(
    trace_store: TraceStore, tmp_path: Path,
) -> None:
    registry, name = PolicyRegistry(trace_store.pool), _name()
    v1 = await registry.publish(await _version(trace_store, name, 1, data=b"abc"), [])
    where = await materialise(v1, trace_store.blobs, tmp_path)
    assert where == tmp_path / name / "v1"
    assert (where / "adapter_model.safetensors").read_bytes().startswith(b"abc")
    assert await materialise(v1, trace_store.blobs, tmp_path) == where
    assert [p.name for p in (tmp_path / name).iterdir()] == ["v1"], "no scratch left behind"


async def test_the_plan_activity_follows_the_newest_version_unless_pinned(
    trace_store: TraceStore, settings: Settings, agent_server: AgentServer,
) -> None:
    registry, name = PolicyRegistry(trace_store.pool), _name()
    agent = AgentSpec(id="helper", provider="sim", model="sim")
    local = AgentSpec(id=name, provider="local", model="some-model")
    plans = PlanActivities(Pool(conductor=local, agents=[agent]), settings)
    assert (await plans.conductor_at(None))[1] == "base", "nothing published yet"
    await registry.publish(await _version(trace_store, name, 1), [])
    plans.conductors._versions = None  # drop the cached newest version
    spec, label = await plans.conductor_at(None)
    assert label == "v1" and spec.checkpoint is not None
    assert (Path(spec.checkpoint) / "adapter_model.safetensors").is_file()
    spec, label = await plans.conductor_at("base")
    assert label == "base" and spec.checkpoint is None

    vllm = local.model_copy(update={"provider": "openai-compatible",
                                    "base_url": agent_server.openai_base_url})
    spec, label = await PlanActivities(Pool(conductor=vllm, agents=[agent]),
                                       settings).conductor_at("v1")
    assert (spec.model, label) == (f"{name}-v1", "v1")
    assert [c.lora_name for c in agent_server.lora_calls("load")] == [f"{name}-v1"]
    api = local.model_copy(update={"provider": "anthropic"})
    with pytest.raises(PolicyError, match="cannot serve a trained version"):
        await PlanActivities(Pool(conductor=api, agents=[agent]), settings).conductor_at("v1")
