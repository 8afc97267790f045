"""Retention: which published versions keep their checkpoint and optimiser state in the blob store.

Every update publishes a checkpoint and an optimiser state (2 GB at 7B with LoRA r=64, 56 GB for
a full fine-tune), so 200 iterations would keep hundreds of GB that nothing needs. The rule
(CheckpointConfig, a recipe's `[checkpoints]`; docs/how-to/checkpoints.md):

- the newest `keep_optimizer_states` versions keep their optimiser state: the trainer only ever
  continues from the newest version (an update from any other parent is a StaleParent);
- the newest `keep_checkpoints` versions keep their checkpoint, and so does every version that is
  pinned (`conductor train pin`), given in `protect` (the CLI adds the pool file's pinned
  version), or used by a plan in the last `served_minutes` (`PolicyRegistry.mark_served`: plans
  in flight, an evaluation or a server running `--policy vN`);
- version 0, the base model, has no files here and is never touched.

A pruned version keeps its row (metrics, history) with `files_pruned`/`optimizer_pruned` set.
Blobs are content-addressed and shared (every LoRA version has the same adapter_config.json; an
update that took no step has its parent's weights; pools can share both), so a blob is deleted
only when no version that is kept, of any policy, refers to it. Pruning holds an advisory lock
that publishing takes shared, and publishing checks its blobs exist under it (policies.py), so a
blob put again by an update in flight is never deleted under it.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

import asyncpg
import structlog
from pydantic import BaseModel, Field

from conductor_engine.engine.contracts.policy_versions import version_label
from conductor_engine.engine.contracts.training import CheckpointConfig
from conductor_engine.engine.storage.blobs import BlobStore, BlobStoreError
from conductor_engine.engine.storage.policies import (
    RETENTION_LOCK,
    PolicyError,
    PolicyRegistry,
    PolicyVersion,
)

log = structlog.get_logger(__name__)


class Pruning(BaseModel):
    """What one pass of the rule removed (or, dry, would remove) for one policy."""

    name: str
    newest: int = 0
    checkpoints: list[int] = Field(default_factory=list, description="versions losing theirs")
    optimizer_states: list[int] = Field(default_factory=list)
    blobs: list[str] = Field(default_factory=list, description="blobs no kept version uses")
    freed_bytes: int = 0
    dry_run: bool = False

    @property
    def nothing(self) -> bool:
        return not (self.checkpoints or self.optimizer_states)


def choose(versions: Sequence[PolicyVersion], rule: CheckpointConfig, now: datetime,
           protect: frozenset[int] = frozenset()) -> tuple[list[int], list[int]]:
    """The versions of one policy whose checkpoint, and whose optimiser state, the rule removes
    now (those already removed are not listed again)."""
    newest = max((v.version for v in versions), default=0)
    served_since = now - timedelta(minutes=rule.served_minutes)

    def keeps_checkpoint(v: PolicyVersion) -> bool:
        return (rule.keep_checkpoints is None or v.version > newest - rule.keep_checkpoints
                or v.pinned or v.version in protect
                or (v.served_at is not None and v.served_at >= served_since))

    checkpoints = [v.version for v in versions
                   if v.files_pruned is None and not keeps_checkpoint(v)]
    states = [v.version for v in versions if v.optimizer is not None
              and v.optimizer_pruned is None and v.version <= newest - rule.keep_optimizer_states]
    return sorted(checkpoints), sorted(states)


def unreferenced(everything: Sequence[PolicyVersion], name: str, checkpoints: Sequence[int],
                 states: Sequence[int]) -> list[str]:
    """The blobs of the versions about to be pruned that no version kept afterwards, of any
    policy, refers to: those alone may be deleted."""
    losing_files, losing_state = set(checkpoints), set(states)
    kept: set[str] = set()
    freed: set[str] = set()
    for v in everything:
        ours = v.name == name
        if ours and v.version in losing_files:
            freed.update(v.files.values())
        elif v.files_pruned is None:
            kept.update(v.files.values())
        if v.optimizer is None:
            continue
        if ours and v.version in losing_state:
            freed.add(v.optimizer)
        elif v.optimizer_pruned is None:
            kept.add(v.optimizer)
    return sorted(freed - kept)


async def prune(registry: PolicyRegistry, blobs: BlobStore, name: str, rule: CheckpointConfig,
                *, protect: frozenset[int] = frozenset(), dry_run: bool = False,
                caches: Sequence[Path] = ()) -> Pruning:
    """Apply the rule to policy `name`: mark the versions pruned, then delete the blobs nothing
    kept refers to, and this machine's materialised copies of pruned checkpoints under
    `caches` (root/NAME/vK). A dry run decides the same and changes nothing.

    Marks are committed before blobs are deleted: a pass cut short leaves blobs nothing refers
    to (garbage, not a broken version), never a kept version without its files."""
    async with registry.pool.acquire() as conn:
        await conn.execute("SELECT pg_advisory_lock($1)", RETENTION_LOCK)
        try:
            now = await conn.fetchval("SELECT now()")
            everything = [PolicyVersion.model_validate(dict(r))
                          for r in await conn.fetch("SELECT * FROM policies")]
            ours = [v for v in everything if v.name == name]
            if not ours:
                raise PolicyError(f"policy {name!r} has no published versions; prune takes the "
                                  f"conductor's pool id (the policy a training run trains)")
            checkpoints, states = choose(ours, rule, now, protect)
            refs = unreferenced(everything, name, checkpoints, states)
            result = Pruning(name=name, newest=max(v.version for v in ours),
                             checkpoints=checkpoints, optimizer_states=states, blobs=refs,
                             freed_bytes=sum([await blobs.size(r) or 0 for r in refs]),
                             dry_run=dry_run)
            if dry_run or result.nothing:
                return result
            async with conn.transaction():
                await conn.execute("UPDATE policies SET files_pruned = now() WHERE name = $1 "
                                   "AND version = ANY($2::int[])", name, checkpoints)
                await conn.execute("UPDATE policies SET optimizer_pruned = now() WHERE name = $1 "
                                   "AND version = ANY($2::int[])", name, states)
            for ref in refs:
                await blobs.delete(ref)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", RETENTION_LOCK)
    for root in caches:
        for version in checkpoints:
            shutil.rmtree(Path(root) / name / version_label(version), ignore_errors=True)
    log.info("retention pruned", policy=name, checkpoints=len(checkpoints),
             optimizer_states=len(states), blobs=len(refs), freed_bytes=result.freed_bytes)
    return result


async def prune_after_publish(registry: PolicyRegistry, blobs: BlobStore, name: str,
                              rule: CheckpointConfig, caches: Sequence[Path] = ()) -> None:
    """The rule applied after a version is published. The version is already committed, so a
    failure here must not fail the update: it is logged, and the next publish (or `conductor
    train prune`) tries again."""
    try:
        await prune(registry, blobs, name, rule, caches=caches)
    except (BlobStoreError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
        log.warning("retention failed; the next update retries it, or run `conductor train "
                    "prune`", policy=name, error=f"{type(e).__name__}: {e}")
