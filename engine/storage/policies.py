"""The policy registry: which versions of a trainable conductor exist, and where their weights are.

A *policy* is a conductor's pool id (its name); version 0 is the base model the pool file names,
and every GRPO update publishes version parent + 1. A version's checkpoint files (safetensors,
LoRA adapter or full weights) live in the blob store, content-addressed; its row in PostgreSQL
says which files, what it was trained from, and the update's metrics.

Publishing a version and marking the traces it decided on (trained on, or left out of their
groups: trainer/rollouts.py) as consumed happen in one transaction, keyed by the update's id. So
a retried update (a trainer killed after committing but before Temporal heard back) finds its
version already there, and no trace is consumed twice.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import asyncpg
import structlog
from pydantic import BaseModel, Field

from conductor_engine.engine.contracts.policy_versions import Version, version_label
from conductor_engine.engine.storage.blobs import BlobStore

log = structlog.get_logger(__name__)

RETENTION_LOCK = 0x0C0D_9E7E
"""Advisory lock key: publishing holds it shared, pruning exclusive (engine/storage/retention.py),
so a blob a version is being published with is never deleted under it."""


class PolicyError(RuntimeError):
    """A version that does not exist or cannot be published; the message says what to do."""


class TraceAlreadyConsumed(PolicyError):
    """Another update trained on one of these traces first; select the groups again."""


class StaleParent(PolicyError):
    """Another version was published since this update started from its parent."""


class CheckpointPruned(PolicyError):
    """The version's checkpoint was removed by retention; a newer or pinned one must be used."""


class BlobsMissing(RuntimeError):
    """A version to publish refers to blobs that are gone (pruned since they were written).
    Not a PolicyError: the update is retried, and writes them again."""


def served_name(name: str, version: int) -> str:
    """The model name a serving engine (vLLM) knows a version by: `NAME-vK`."""
    return name if version == 0 else f"{name}-{version_label(version)}"


class PolicyVersion(BaseModel):
    """One published version."""

    name: str
    version: Version
    parent: Version
    base_model: str
    kind: Literal["lora", "full"]
    files: dict[str, str] = Field(description="checkpoint file name → blob reference")
    optimizer: str | None = Field(default=None, description="blob reference of optimizer state")
    metrics: dict[str, Any] = Field(default_factory=dict)
    update_id: str
    created: datetime | None = None
    pinned: bool = Field(default=False, description="never pruned (`conductor train pin`)")
    served_at: datetime | None = Field(default=None, description="when a plan last used it")
    files_pruned: datetime | None = Field(default=None, description="checkpoint removed at")
    optimizer_pruned: datetime | None = Field(default=None,
                                              description="optimiser state removed at")

    @property
    def label(self) -> str:
        return version_label(self.version)


class PolicyRegistry:
    """Reads and writes the `policies` table (migration 004) through an asyncpg pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def latest(self, name: str) -> PolicyVersion | None:
        row = await self.pool.fetchrow(
            "SELECT * FROM policies WHERE name = $1 ORDER BY version DESC LIMIT 1", name
        )
        return None if row is None else PolicyVersion.model_validate(dict(row))

    async def latest_version(self, name: str) -> int:
        """The newest version number, 0 when nothing was published yet."""
        value = await self.pool.fetchval(
            "SELECT max(version) FROM policies WHERE name = $1", name
        )
        return int(value or 0)

    async def get(self, name: str, version: int) -> PolicyVersion:
        row = await self.pool.fetchrow(
            "SELECT * FROM policies WHERE name = $1 AND version = $2", name, version
        )
        if row is None:
            have = await self.latest_version(name)
            raise PolicyError(
                f"policy {name!r} has no version {version_label(version)} (newest: "
                f"{version_label(have)}); pin an existing version or train one first"
            )
        return PolicyVersion.model_validate(dict(row))

    async def by_update(self, update_id: str) -> PolicyVersion | None:
        row = await self.pool.fetchrow("SELECT * FROM policies WHERE update_id = $1", update_id)
        return None if row is None else PolicyVersion.model_validate(dict(row))

    async def history(self, name: str) -> list[PolicyVersion]:
        rows = await self.pool.fetch(
            "SELECT * FROM policies WHERE name = $1 ORDER BY version", name
        )
        return [PolicyVersion.model_validate(dict(r)) for r in rows]

    async def publish(
        self, version: PolicyVersion, consumed: list[tuple[str, str]],
        blobs: BlobStore | None = None,
    ) -> PolicyVersion:
        """Register `version` and mark the traces it decided on (workflow id, run id) consumed:
        those it trained on and those its groups left out, so none is chosen again.

        Idempotent per update id: a retry of a committed update returns the committed version.
        Raises StaleParent when the policy moved on since `version.parent`, and
        TraceAlreadyConsumed when another update took one of the traces; nothing is written then.
        Given `blobs`, checks (with pruning locked out) that every blob the version refers to is
        there: a blob shared by content with a version being pruned could be deleted between
        its `put` (which found it present) and this commit; BlobsMissing then.
        """
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock_shared($1)", RETENTION_LOCK)
            # one publisher per policy at a time: versions stay a line, not a tree
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", version.name)
            done = await conn.fetchrow(
                "SELECT * FROM policies WHERE update_id = $1", version.update_id
            )
            if done is not None:
                return PolicyVersion.model_validate(dict(done))
            newest = int(await conn.fetchval(
                "SELECT coalesce(max(version), 0) FROM policies WHERE name = $1", version.name
            ))
            if newest != version.parent or version.version != version.parent + 1:
                raise StaleParent(
                    f"policy {version.name!r} is at {version_label(newest)}, but this update "
                    f"trained {version_label(version.version)} from "
                    f"{version_label(version.parent)}; run one trainer per policy"
                )
            if blobs is not None:
                await _check_blobs(version, blobs)
            wf, run = [c[0] for c in consumed], [c[1] for c in consumed]
            taken = await conn.fetchval(
                """
                WITH t AS (
                    UPDATE traces SET consumed_by = $1
                    FROM unnest($2::text[], $3::text[]) AS c(workflow_id, run_id)
                    WHERE traces.workflow_id = c.workflow_id AND traces.run_id = c.run_id
                      AND traces.consumed_by IS NULL
                    RETURNING 1)
                SELECT count(*) FROM t
                """,
                version.update_id, wf, run,
            )
            if taken != len(consumed):
                raise TraceAlreadyConsumed(
                    f"{len(consumed) - taken} of the {len(consumed)} traces of update "
                    f"{version.update_id} were already trained on (or are gone); the update is "
                    f"not published and will select its groups again"
                )
            row = await conn.fetchrow(
                """
                INSERT INTO policies (name, version, parent, base_model, kind, files, optimizer,
                                      metrics, update_id)
                VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING *
                """,
                version.name, version.version, version.parent, version.base_model, version.kind,
                version.files, version.optimizer, version.metrics, version.update_id,
            )
        return PolicyVersion.model_validate(dict(row))

    async def mark_served(self, name: str, version: int) -> None:
        """Record that a plan is using `version` now, so retention keeps its checkpoint for a
        while (CheckpointConfig.served_minutes). Written at most once a minute per version:
        every plan calls this, and an unchanged row costs no write. Under the retention lock
        (shared): a prune under way finishes first, so what the plan reads next says whether
        the checkpoint is still there, and no prune after this removes it."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock_shared($1)", RETENTION_LOCK)
            await conn.execute(
                "UPDATE policies SET served_at = now() WHERE name = $1 AND version = $2 AND "
                "(served_at IS NULL OR served_at < now() - interval '1 minute')", name, version)

    async def set_pinned(self, name: str, version: int, pinned: bool) -> PolicyVersion:
        """Pin (or unpin) a version: a pinned version's checkpoint is never pruned. Pinning one
        already pruned raises CheckpointPruned: its files are gone."""
        current = await self.get(name, version)  # raises, saying which versions exist
        if pinned and current.files_pruned is not None:
            raise CheckpointPruned(pruned_message(current, await self.latest_version(name)))
        row = await self.pool.fetchrow(
            "UPDATE policies SET pinned = $3 WHERE name = $1 AND version = $2 RETURNING *",
            name, version, pinned)
        return PolicyVersion.model_validate(dict(row))

    async def consumed_by(self, update_id: str) -> list[tuple[str, str]]:
        rows = await self.pool.fetch(
            "SELECT workflow_id, run_id FROM traces WHERE consumed_by = $1 ORDER BY workflow_id",
            update_id,
        )
        return [(r["workflow_id"], r["run_id"]) for r in rows]


UNREACHABLE = (OSError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError,
               asyncpg.exceptions.OperatorInterventionError)
"""What reading the registry raises while PostgreSQL is down or restarting (no socket, a
connection the server closed, "the database system is starting up"), as opposed to an answer."""


class ServedMarks:
    """`PolicyRegistry.mark_served` at most once a minute per version from this process: the
    plan activity calls it on every plan, and retention only needs minutes."""

    def __init__(self, every_s: float = 60.0) -> None:
        self.every_s = every_s
        self._last: dict[tuple[str, int], float] = {}

    async def mark(self, registry: PolicyRegistry, name: str, version: int) -> None:
        now = time.monotonic()
        last = self._last.get((name, version))
        if last is not None and now - last < self.every_s:
            return
        await registry.mark_served(name, version)
        self._last[(name, version)] = now


class VersionCache:
    """The newest version of each policy, re-read at most every `ttl_s` seconds.

    The plan activity asks this on every plan; a published version reaches new plans within
    `ttl_s` without a database round trip per plan.

    While PostgreSQL cannot be reached (UNREACHABLE), the version read last is served, however
    old. Why: a pool that follows the newest version (the default) asks this on every plan, so
    a trace store restarting for 30 s used to fail every plan of that window and, after its
    retries, the run itself ("planning round 1 failed: [Errno 2] No such file or directory"),
    though nothing but the version number needs the database, and the version a moment old is
    the one the plan would have had a moment earlier. With nothing read yet, the error stands
    (retried by Temporal, with a message that names the registry).
    """

    def __init__(self, registry: PolicyRegistry, ttl_s: float = 2.0) -> None:
        self.registry = registry
        self.ttl_s = ttl_s
        self._seen: dict[str, tuple[float, int]] = {}

    async def newest(self, name: str) -> int:
        now = time.monotonic()
        hit = self._seen.get(name)
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        try:
            version = await self.registry.latest_version(name)
        except UNREACHABLE as e:
            if hit is None:
                raise OSError(f"cannot read the newest version of policy {name!r} from the "
                              f"policy registry (PostgreSQL): {type(e).__name__}: {e}") from e
            return hit[1]  # the last known version; re-read on the next call
        self._seen[name] = (now, version)
        return version


async def _check_blobs(version: PolicyVersion, blobs: BlobStore) -> None:
    refs = [*version.files.values(), *([version.optimizer] if version.optimizer else [])]
    missing = [r for r in refs if not await blobs.exists(r)]
    if missing:
        raise BlobsMissing(f"version {version.label} of {version.name!r} refers to "
                           f"{len(missing)} blob(s) no longer in {blobs.location} (pruned while "
                           f"it was published); the update runs again and stores them again")


def pruned_message(version: PolicyVersion, newest: int | None = None) -> str:
    """What loading a pruned checkpoint says: what happened and what to do instead."""
    kept = f" (newest: {version_label(newest)})" if newest is not None else ""
    return (f"the checkpoint of {version.name!r} {version.label} was removed by retention "
            f"(pruned {version.files_pruned:%Y-%m-%d %H:%M} UTC); use a version that is "
            f"kept{kept}, and pin versions to keep with `conductor train pin {version.name} vN` "
            f"([checkpoints] in the recipe sets how many are kept)")


async def materialise(version: PolicyVersion, blobs: BlobStore, root: Path) -> Path:
    """The version's checkpoint as a directory `root/NAME/vK` (what peft, transformers and vLLM's
    `lora_path` read), fetched from the blob store once and then reused.

    Written into a scratch sibling and renamed into place, so a reader never sees half a
    checkpoint and two processes fetching at once do not interfere. Each file streams from the
    store (a full 7B checkpoint is ~28 GB). A version whose checkpoint retention removed raises
    CheckpointPruned, unless this machine still holds its copy.
    """
    target = root / version.name / version.label
    if (target / ".complete").is_file():
        return target
    if version.files_pruned is not None:
        raise CheckpointPruned(pruned_message(version))
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.parent / f".{version.label}.{os.getpid()}-{uuid.uuid4().hex[:8]}"
    scratch.mkdir()
    try:
        for file_name, ref in version.files.items():
            await blobs.get_to_file(ref, scratch / file_name)
        (scratch / ".complete").write_text(version.update_id)
        try:
            os.rename(scratch, target)
        except OSError:
            if not (target / ".complete").is_file():  # else another process got there first
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


async def optimizer_file(version: PolicyVersion, blobs: BlobStore, path: Path) -> Path | None:
    """The version's optimiser state streamed to `path`, or None when it has none: saved
    without one, or removed by retention (only the newest few keep theirs:
    CheckpointConfig.keep_optimizer_states). Then training continues with a fresh optimiser,
    and the log says so."""
    if version.optimizer is None or version.optimizer_pruned is not None:
        why = "was pruned" if version.optimizer_pruned is not None else "was never saved"
        log.warning("optimizer state unavailable; continuing with a fresh optimizer",
                    policy=version.name, version=version.label, reason=why)
        return None
    await blobs.get_to_file(version.optimizer, path)
    return path
