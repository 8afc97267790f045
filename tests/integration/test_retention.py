"""Retention of checkpoints and optimiser states on real PostgreSQL and a real blob store:
a long run's blobs stay bounded by the rule, pinned and served versions keep their checkpoint,
a version a plan pins stays loadable, blobs shared by content outlive the versions pruned, and
`conductor train prune` lists before it removes."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from conductor_engine.activities.plan import PlanActivities
from conductor_engine.engine.contracts.training import (
    CheckpointConfig,
    LossConfig,
    PolicyConfig,
    Recipe,
    RolloutConfig,
    UpdateRequest,
)
from conductor_engine.engine.providers.pool import AgentSpec, Pool
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.blobs import BlobStore, LocalBlobStore, S3BlobStore
from conductor_engine.engine.storage.policies import (
    BlobsMissing,
    CheckpointPruned,
    PolicyRegistry,
    PolicyVersion,
    materialise,
    optimizer_file,
)
from conductor_engine.engine.storage.retention import prune, prune_after_publish
from conductor_engine.engine.storage.trace_store import TraceStore
from tests.blob_stores import fresh_bucket, stored_objects
from tests.cli import run_conductor, stack_env
from tests.rollout_groups import write_groups

CONFIG = b'{"peft_type": "LORA", "r": 8}'  # the same in every version: one shared blob


def _name() -> str:
    return f"keep-{uuid.uuid4().hex[:8]}"


async def publish(registry: PolicyRegistry, blobs: BlobStore, tmp: Path, name: str,
                  version: int) -> PolicyVersion:
    """Version `version` as the trainer publishes one: checkpoint files and an optimiser state
    streamed into the store (`put_file`), then the row."""
    return await registry.publish(await saved(blobs, tmp, name, version), [], blobs=blobs)


async def saved(blobs: BlobStore, tmp: Path, name: str, version: int) -> PolicyVersion:
    """What the trainer's `_save` makes: the files in the store, the row not yet published."""
    out = tmp / f"{name}-v{version}"
    out.mkdir()
    (out / "adapter_config.json").write_bytes(CONFIG)
    (out / "adapter_model.safetensors").write_bytes(f"weights {name} {version}".encode())
    (out / "optimizer.safetensors").write_bytes(f"adam {name} {version}".encode())
    files = {f: await blobs.put_file(out / f)
             for f in ("adapter_config.json", "adapter_model.safetensors")}
    return PolicyVersion(
        name=name, version=version, parent=version - 1, base_model="base", kind="lora",
        files=files, optimizer=await blobs.put_file(out / "optimizer.safetensors"),
        update_id=f"{name}/{version}")


def blob_count(store: BlobStore) -> int:
    return len([k for k in stored_objects(store) if k.startswith("sha256/")])


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    """A blob store of the test's own, so counting its files counts this test's alone."""
    if request.param == "local":
        return LocalBlobStore(tmp_path / "blobs")
    url = request.getfixturevalue("moto_url")
    return S3BlobStore(fresh_bucket(url, request.getfixturevalue("monkeypatch")),
                       endpoint_url=url)


async def test_a_long_run_keeps_a_bounded_number_of_blobs(
        trace_store: TraceStore, store: BlobStore, tmp_path: Path) -> None:
    registry, name, blobs = PolicyRegistry(trace_store.pool), _name(), store
    rule = CheckpointConfig(keep_optimizer_states=2, keep_checkpoints=3)
    for version in range(1, 21):
        await publish(registry, blobs, tmp_path, name, version)
        await prune_after_publish(registry, blobs, name, rule)
        kept = min(version, 3) + min(version, 2) + 1  # weights, optimiser states, the config
        assert blob_count(blobs) == kept, f"after v{version}"
    history = await registry.history(name)
    assert [v.version for v in history if v.files_pruned is None] == [18, 19, 20]
    assert [v.version for v in history if v.optimizer_pruned is None] == [19, 20]
    newest = history[-1]
    where = await materialise(newest, blobs, tmp_path / "policies")
    assert (where / "adapter_config.json").read_bytes() == CONFIG  # the shared blob stayed
    assert len(history) == 20 and history[0].metrics == {}, "pruned rows keep their history"


async def test_pinned_and_served_versions_keep_their_checkpoint(
        trace_store: TraceStore, settings: Settings, tmp_path: Path) -> None:
    registry, name = PolicyRegistry(trace_store.pool), _name()
    blobs = trace_store.blobs  # the plan activity reads the settings' own store
    for version in range(1, 9):
        await publish(registry, blobs, tmp_path, name, version)
    await registry.set_pinned(name, 2, True)
    # a plan pinned to v3 (`--policy v3`, a pool file's policy_version) is running
    conductor = AgentSpec(id=name, provider="local", model="some-model")
    plans = PlanActivities(Pool(conductor=conductor,
                                agents=[AgentSpec(id="helper", provider="sim", model="sim")]),
                           settings)
    spec, label = await plans.conductor_at("v3")
    assert label == "v3" and spec.checkpoint is not None

    done = await prune(registry, blobs, name, CheckpointConfig(keep_checkpoints=2))
    assert done.checkpoints == [1, 4, 5, 6]
    assert done.optimizer_states == [1, 2, 3, 4, 5, 6]
    kept = {v.version: v for v in await registry.history(name)}
    for version in (2, 3, 7, 8):  # pinned, served, the newest two: still loadable anywhere
        where = await materialise(kept[version], blobs, tmp_path / "elsewhere")
        assert (where / "adapter_model.safetensors").read_bytes() == \
            f"weights {name} {version}".encode()
    with pytest.raises(CheckpointPruned, match=r"v4 was removed by retention.*conductor train pin"):
        await materialise(kept[4], blobs, tmp_path / "elsewhere")
    assert await blobs.exists(kept[2].files["adapter_model.safetensors"])
    assert not await blobs.exists(kept[4].files["adapter_model.safetensors"])
    assert not await blobs.exists(kept[2].optimizer or "")  # pinning keeps the checkpoint only
    # a trainer loading a version whose optimiser state went continues with a fresh one
    assert await optimizer_file(kept[6], blobs, tmp_path / "adam") is None
    assert await optimizer_file(kept[7], blobs, tmp_path / "adam") == tmp_path / "adam"
    spec, _ = await plans.conductor_at("v3")  # the plan's next attempt still finds it
    assert spec.checkpoint is not None


async def test_a_blob_pruned_before_its_version_is_published_fails_the_publish(
        trace_store: TraceStore, tmp_path: Path) -> None:
    """An update that `put` a blob another version shared, just before pruning deleted it,
    must not publish a version without its files: it fails (and the update is retried)."""
    registry, name = PolicyRegistry(trace_store.pool), _name()
    blobs = LocalBlobStore(tmp_path / "blobs")
    await publish(registry, blobs, tmp_path, name, 1)
    v2 = await saved(blobs, tmp_path, name, 2)  # its adapter_config.json: v1's blob, found there
    await blobs.delete(v2.files["adapter_config.json"])  # a prune of v1 (elsewhere) got there
    with pytest.raises(BlobsMissing, match="pruned while it was published"):
        await registry.publish(v2, [], blobs=blobs)
    assert await registry.latest_version(name) == 1


async def test_train_prune_lists_with_dry_run_then_removes(
        trace_store: TraceStore, settings: Settings, tmp_path: Path) -> None:
    registry, name = PolicyRegistry(trace_store.pool), _name()
    data = tmp_path / "data"
    blobs = LocalBlobStore(data / "blobs")  # where `conductor` finds them, under its data dir
    for version in range(1, 7):
        await publish(registry, blobs, tmp_path, name, version)
    pool = tmp_path / "pool.toml"  # its conductor pins v3: runs of this pool need it
    pool.write_text(f'[conductor]\nid = "{name}"\nprovider = "local"\nmodel = "m"\n'
                    f'policy_version = "v3"\n\n[[agents]]\nid = "a"\nprovider = "sim"\n'
                    f'model = "sim"\n')
    env = stack_env(settings.model_copy(update={"data_dir": data}), pool)
    rule = ("--keep", "1", "--keep-checkpoints", "2")
    before = blob_count(blobs)
    dry = run_conductor("train", "prune", name, *rule, "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert ("would remove checkpoints of v1, v2, v4; optimiser states of v1, v2, v3, v4, "
            "v5; 8 blobs") in dry.stdout
    assert blob_count(blobs) == before, "a dry run removed blobs"
    assert all(v.files_pruned is None for v in await registry.history(name))
    done = run_conductor("train", "prune", name, *rule, env=env)
    assert done.returncode == 0, done.stderr
    assert "removed checkpoints of v1, v2, v4" in done.stdout
    assert blob_count(blobs) == before - 8  # 3 weights, 5 optimiser states; the config stays
    v3 = await materialise(await registry.get(name, 3), blobs, tmp_path / "fresh")
    assert (v3 / "adapter_model.safetensors").is_file(), "the pool's pinned version went"
    again = run_conductor("train", "prune", name, *rule, env=env)
    assert "removed checkpoints of none; optimiser states of none; 0 blobs" in again.stdout

    pin = run_conductor("train", "pin", name, "v5", env=env)
    assert pin.returncode == 0 and f"{name} v5 pinned" in pin.stderr, pin.stderr
    await publish(registry, blobs, tmp_path, name, 7)
    kept = run_conductor("train", "prune", name, *rule, env=env)
    assert "removed checkpoints of none;" in kept.stdout, "the pinned v5 went"
    gone = run_conductor("train", "pin", name, "v1", env=env)
    assert gone.returncode == 1 and "v1 was removed by retention" in gone.stderr
    unknown = run_conductor("train", "prune", "no-such-policy", env=env)
    assert unknown.returncode == 1 and "has no published versions" in unknown.stderr


async def test_the_trainer_prunes_as_it_trains(
        base_settings: Settings, trace_store: TraceStore, tiny_policy_dir: Path,
        tmp_path: Path) -> None:
    """Real GRPO updates of a tiny policy: after each publish only the rule's files remain."""
    from conductor_engine.trainer.service import Trainer

    name = f"prune-{uuid.uuid4().hex[:6]}"
    tasks = [f"prune-{i}" for i in range(4)]
    await write_groups(trace_store, name, tasks, group_size=4)
    settings = base_settings.model_copy(update={"data_dir": tmp_path, "trainer_task_queue": name})
    trainer = Trainer(settings)
    blobs = LocalBlobStore(settings.blobs_path)
    for parent, task in enumerate(tasks):
        recipe = Recipe(
            policy=PolicyConfig(base=str(tiny_policy_dir), lora=True, lora_r=4, device="cpu"),
            loss=LossConfig(learning_rate=1e-3, micro_batch_size=8),
            rollouts=RolloutConfig(group_size=4, groups_per_update=1, max_staleness=10,
                                   task_ids=[task]),
            checkpoints=CheckpointConfig(keep_optimizer_states=1, keep_checkpoints=2))
        result = await trainer.update(UpdateRequest(
            name=name, parent=parent, update_id=f"{name}-{parent}", recipe=recipe))
        assert result.published and result.version == parent + 1, result
        # per kept checkpoint its adapter weights, one shared adapter_config, one optimiser state
        assert blob_count(blobs) == min(parent + 1, 2) + 1 + 1, f"after v{parent + 1}"
    history = await PolicyRegistry(trace_store.pool).history(name)
    assert [v.version for v in history if v.files_pruned is None] == [3, 4]
    assert [v.version for v in history if v.optimizer_pruned is None] == [4]
