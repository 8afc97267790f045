"""The retention rule as a decision over versions (engine/storage/retention.py): which versions
lose their checkpoint or optimiser state, and which blobs no kept version refers to."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

from conductor_engine.engine.contracts.training import CheckpointConfig
from conductor_engine.engine.storage.policies import PolicyVersion
from conductor_engine.engine.storage.retention import choose, unreferenced

NOW = datetime(2026, 1, 1, tzinfo=UTC)
CONFIG = "sha256:" + "c" * 64


def ref(what: str) -> str:
    return "sha256:" + hashlib.sha256(what.encode()).hexdigest()


def version(n: int, name: str = "p", **fields: object) -> PolicyVersion:
    return PolicyVersion.model_validate({
        "name": name, "version": n, "parent": n - 1, "base_model": "m", "kind": "lora",
        "files": {"adapter_config.json": CONFIG, "adapter_model.safetensors": ref(f"{name}{n}")},
        "optimizer": ref(f"adam {name}{n}"), "update_id": f"{name}/{n}", **fields})


def test_the_newest_versions_keep_their_files_and_older_ones_lose_them() -> None:
    versions = [version(n) for n in range(1, 11)]
    rule = CheckpointConfig(keep_optimizer_states=2, keep_checkpoints=3)
    assert choose(versions, rule, NOW) == (list(range(1, 8)), list(range(1, 9)))


def test_pinned_protected_and_recently_served_versions_keep_their_checkpoint() -> None:
    versions = [version(1, pinned=True), version(2, served_at=NOW - timedelta(minutes=5)),
                version(3, served_at=NOW - timedelta(minutes=30)), version(4), version(5),
                version(6)]
    checkpoints, states = choose(versions, CheckpointConfig(keep_checkpoints=1,
                                                            served_minutes=15), NOW,
                                 protect=frozenset({4}))
    assert checkpoints == [3, 5]
    assert states == [1, 2, 3, 4], "pinning and serving keep checkpoints, not optimiser states"


def test_no_checkpoint_limit_keeps_every_checkpoint_and_pruned_ones_are_not_listed_again() -> None:
    versions = [version(1, files_pruned=NOW, optimizer_pruned=NOW), version(2), version(3)]
    assert choose(versions, CheckpointConfig(keep_checkpoints=None, keep_optimizer_states=1),
                  NOW) == ([], [2])
    assert choose(versions, CheckpointConfig(keep_checkpoints=1, keep_optimizer_states=1),
                  NOW) == ([2], [2])


def test_a_blob_goes_only_when_no_kept_version_of_any_policy_refers_to_it() -> None:
    shared = ref("shared")
    same_as_v2 = {"adapter_config.json": CONFIG, "adapter_model.safetensors": ref("p2")}
    ours = [version(1), version(2), version(3, files=same_as_v2)]
    ours[0].files["extra"] = shared
    theirs = [version(1, name="other", files={"adapter_model.safetensors": shared}),
              version(2, name="other", files={"adapter_model.safetensors": ref("o2")},
                      files_pruned=NOW)]
    freed = unreferenced([*ours, *theirs], "p", checkpoints=[1, 2], states=[1])
    # v2's weights are v3's too (an update that took no step); the config is everyone's;
    # `shared` is still the other policy's v1's; only v1's weights and optimiser state go
    assert freed == sorted([ref("p1"), ref("adam p1")])
    # once the other policy's v1 is pruned too, nothing kept refers to `shared`
    pruned = theirs[0].model_copy(update={"files_pruned": NOW})
    assert shared in unreferenced([*ours, pruned, theirs[1]], "p", [1], [])
