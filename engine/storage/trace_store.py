"""The trace store: traces in PostgreSQL (asyncpg), large texts in the blob store.

Writes are upserts keyed by (workflow id, run id): a record activity that is retried, or a
workflow replayed, writes the same row again instead of a second one. Any string in a trace
longer than the blob threshold (an agent's 5 MB output, a long prompt) is replaced in the stored
document by `{"$blob": "sha256:...", "bytes": n, "preview": "..."}` and put in the blob store;
reads put the text back unless asked not to.

The trainer reads *groups*: the root traces of one task under one policy version.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import asyncpg
from pydantic import BaseModel, Field

from conductor_engine.engine.storage.blobs import BlobStore
from conductor_engine.engine.storage.database import connect_pool
from conductor_engine.engine.storage.traces import PolicyRef, Trace

BLOB_KEY = "$blob"
PREVIEW_CHARS = 200

_UPSERT = """
WITH written AS (
    INSERT INTO traces (
        workflow_id, run_id, parent_workflow_id, depth, task_id, dataset, tags, policy_name,
        policy_version, status, reward, correct, verifier, input_tokens, output_tokens,
        cost_usd, seconds, started_at, finished_at, schema_version, trace, batch, superseded)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
            $19, $20, $21, $22,
            EXISTS (SELECT 1 FROM traces n WHERE n.workflow_id = $1 AND n.finished_at > $19))
    ON CONFLICT (workflow_id, run_id) DO UPDATE SET
        parent_workflow_id = EXCLUDED.parent_workflow_id, depth = EXCLUDED.depth,
        task_id = EXCLUDED.task_id, dataset = EXCLUDED.dataset, tags = EXCLUDED.tags,
        policy_name = EXCLUDED.policy_name, policy_version = EXCLUDED.policy_version,
        status = EXCLUDED.status, reward = EXCLUDED.reward, correct = EXCLUDED.correct,
        verifier = EXCLUDED.verifier, input_tokens = EXCLUDED.input_tokens,
        output_tokens = EXCLUDED.output_tokens, cost_usd = EXCLUDED.cost_usd,
        seconds = EXCLUDED.seconds, started_at = EXCLUDED.started_at,
        finished_at = EXCLUDED.finished_at, schema_version = EXCLUDED.schema_version,
        trace = EXCLUDED.trace, batch = EXCLUDED.batch
    RETURNING workflow_id, finished_at)
-- a resumed run supersedes the workflow's earlier runs (one statement, one round trip)
UPDATE traces SET superseded = true FROM written
WHERE traces.workflow_id = written.workflow_id AND traces.finished_at < written.finished_at
    AND NOT traces.superseded
"""

_SUMMARY_COLUMNS = """
    workflow_id, run_id, parent_workflow_id, task_id, dataset, tags, policy_name,
    policy_version, status, reward, correct, input_tokens, output_tokens, cost_usd, seconds,
    finished_at, left(coalesce(trace->'task'->>'question', ''), 200) AS question
"""


class TraceSummary(BaseModel):
    """One row of `conductor traces list`."""

    workflow_id: str
    run_id: str
    parent_workflow_id: str | None
    task_id: str
    dataset: str | None
    tags: list[str]
    policy: PolicyRef
    status: str
    reward: float | None
    correct: bool | None
    input_tokens: int
    output_tokens: int
    cost_usd: float
    seconds: float
    finished_at: datetime
    question: str


class TraceFilter(BaseModel):
    dataset: str | None = None
    batch: str | None = None
    tag: str | None = None
    task_id: str | None = None
    policy_name: str | None = None
    policy_version: str | None = None
    status: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    since: datetime | None = None
    until: datetime | None = None
    roots_only: bool = Field(default=True, description="leave out self-call traces")

    def where(self) -> tuple[str, list[Any]]:
        """A parameterised WHERE clause; every filter is an indexed column."""
        clauses: list[str] = []
        args: list[Any] = []

        def add(sql: str, value: Any) -> None:
            args.append(value)
            clauses.append(sql.format(f"${len(args)}"))

        for column in ("dataset", "batch", "task_id", "policy_name", "policy_version", "status"):
            if (value := getattr(self, column)) is not None:
                add(f"{column} = {{}}", value)
        if self.tag is not None:
            add("tags @> ARRAY[{}]::text[]", self.tag)
        if self.min_reward is not None:
            add("reward >= {}", self.min_reward)
        if self.max_reward is not None:
            add("reward <= {}", self.max_reward)
        if self.since is not None:
            add("finished_at >= {}", self.since)
        if self.until is not None:
            add("finished_at < {}", self.until)
        if self.roots_only:
            clauses.append("depth = 0")
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", args


class Group(BaseModel):
    """GRPO's unit: `size` rollouts of one task under one policy version, oldest first."""

    task_id: str
    policy: PolicyRef
    traces: list[Trace]

    @property
    def rewards(self) -> list[float]:
        return [t.reward.value if t.reward and t.reward.value is not None else 0.0
                for t in self.traces]


class TraceStore:
    def __init__(self, pool: asyncpg.Pool, blobs: BlobStore, *, blob_threshold: int) -> None:
        self.pool = pool
        self.blobs = blobs
        self.blob_threshold = blob_threshold

    @classmethod
    async def open(
        cls, url: str, blobs: BlobStore, *, blob_threshold: int = 64 * 1024, max_size: int = 10
    ) -> TraceStore:
        """Connect and migrate (idempotent): the schema is always current after open."""
        return cls(await connect_pool(url, max_size=max_size), blobs, blob_threshold=blob_threshold)

    async def close(self) -> None:
        await self.pool.close()

    # --- writing ---------------------------------------------------------------------------

    async def write(self, trace: Trace) -> None:
        """Insert or replace the trace's row: the same (workflow id, run id) is one row."""
        await self.pool.execute(_UPSERT, *await self.row(trace))

    async def row(self, trace: Trace) -> tuple[Any, ...]:
        """The row's values in _UPSERT's order, large texts moved to the blob store. A
        document no longer than the threshold cannot hold a longer text: it goes as is."""
        doc: bytes | dict[str, Any] = trace.document_json()
        if len(doc) > self.blob_threshold:
            doc = await self._offload(trace.document())
        verdict = trace.reward.verdict if trace.reward else None
        usage = trace.totals.usage
        return (
            trace.workflow_id, trace.run_id, trace.parent_workflow_id, trace.depth,
            trace.task.id, trace.task.dataset, trace.task.tags, trace.policy.name,
            trace.policy.version, trace.status,
            trace.reward.value if trace.reward else None,
            verdict.correct if verdict else None, verdict.verifier if verdict else None,
            usage.input_tokens, usage.output_tokens, trace.totals.cost_usd, trace.totals.seconds,
            trace.started_at, trace.finished_at, trace.schema_version, doc, trace.task.batch,
        )

    async def _offload(self, value: Any) -> Any:
        if isinstance(value, str):
            if len(value) > self.blob_threshold // 4:
                data = value.encode()
                if len(data) > self.blob_threshold:
                    ref = await self.blobs.put(data)
                    return {BLOB_KEY: ref, "bytes": len(data), "preview": value[:PREVIEW_CHARS]}
            return value
        if isinstance(value, dict):
            return {k: await self._offload(v) for k, v in value.items()}
        if isinstance(value, list) and value and isinstance(value[0], str | dict | list):
            return [await self._offload(v) for v in value]
        return value

    async def _restore(self, value: Any) -> Any:
        if isinstance(value, dict):
            if BLOB_KEY in value:
                return (await self.blobs.get(value[BLOB_KEY])).decode()
            return {k: await self._restore(v) for k, v in value.items()}
        if isinstance(value, list) and value and isinstance(value[0], dict | list):
            return [await self._restore(v) for v in value]
        return value

    # --- reading ---------------------------------------------------------------------------

    async def _trace(self, doc: dict[str, Any], resolve_blobs: bool) -> Trace:
        if resolve_blobs:
            doc = await self._restore(doc)
        return Trace.from_document(doc)

    async def get(
        self, workflow_id: str, run_id: str | None = None, *, children: bool = True,
        resolve_blobs: bool = True,
    ) -> Trace | None:
        """One trace (the latest run of the workflow unless run_id is given), with its
        self-call traces nested under `children`, recursively."""
        if run_id:
            doc = await self.pool.fetchval(
                "SELECT trace FROM traces WHERE workflow_id = $1 AND run_id = $2",
                workflow_id, run_id,
            )
        else:
            doc = await self.pool.fetchval(
                "SELECT trace FROM traces WHERE workflow_id = $1 "
                "ORDER BY finished_at DESC LIMIT 1", workflow_id,
            )
        if doc is None:
            return None
        trace = await self._trace(doc, resolve_blobs)
        if children:
            kids = [await self.get(cid, resolve_blobs=resolve_blobs)
                    for cid in trace.child_workflow_ids]
            trace.children = [k for k in kids if k is not None]
        return trace

    async def search(
        self, filters: TraceFilter | None = None, *, limit: int = 50, offset: int = 0
    ) -> list[TraceSummary]:
        where, args = (filters or TraceFilter()).where()
        rows = await self.pool.fetch(
            f"SELECT {_SUMMARY_COLUMNS} FROM traces{where} "
            f"ORDER BY finished_at DESC LIMIT {int(limit)} OFFSET {int(offset)}",
            *args,
        )
        return [_summary(r) for r in rows]

    async def batch_traces(self, batch: str, *, resolve_blobs: bool = True) -> list[Trace]:
        """The latest trace of every run of a batch (a resumed run's new trace, not the
        failed one), in task order of first start."""
        rows = await self.pool.fetch(
            "SELECT DISTINCT ON (workflow_id) trace FROM traces "
            "WHERE batch = $1 AND depth = 0 ORDER BY workflow_id, finished_at DESC", batch,
        )
        traces = [await self._trace(r["trace"], resolve_blobs) for r in rows]
        return sorted(traces, key=lambda t: t.started_at)

    async def count(self, filters: TraceFilter | None = None) -> int:
        where, args = (filters or TraceFilter()).where()
        return int(await self.pool.fetchval(f"SELECT count(*) FROM traces{where}", *args))

    async def groups(
        self,
        policy: PolicyRef,
        *,
        size: int,
        limit: int = 4,
        dataset: str | None = None,
        statuses: tuple[str, ...] = ("completed", "invalid_plan", "failed"),
        resolve_blobs: bool = True,
        unconsumed: bool = False,
        task_ids: list[str] | None = None,
    ) -> list[Group]:
        """Up to `limit` complete groups: tasks with at least `size` root traces under this
        policy version, each group its `size` oldest traces. Two indexed queries.

        `unconsumed` leaves out traces a published update already trained on (the trainer's
        view); `task_ids` keeps only those tasks."""
        args: list[Any] = [policy.name, policy.version, list(statuses), size]
        dataset_sql = ""
        if dataset is not None:
            args.append(dataset)
            dataset_sql = f" AND dataset = ${len(args)}"
        if task_ids is not None:
            args.append(task_ids)
            dataset_sql += f" AND task_id = ANY(${len(args)})"
        if unconsumed:
            dataset_sql += " AND consumed_by IS NULL"
        # a resumed run's earlier, failed run is superseded: only the latest run is a rollout
        base = (
            "depth = 0 AND NOT superseded AND policy_name = $1 AND policy_version = $2 "
            "AND status = ANY($3)" + dataset_sql
        )
        rows = await self.pool.fetch(
            f"""
            WITH g AS (
                SELECT task_id, min(finished_at) AS first FROM traces WHERE {base}
                GROUP BY task_id HAVING count(*) >= $4 ORDER BY first LIMIT {int(limit)})
            SELECT g.task_id, r.trace FROM g CROSS JOIN LATERAL (
                SELECT trace FROM traces WHERE {base} AND traces.task_id = g.task_id
                ORDER BY finished_at, workflow_id LIMIT $4) r
            ORDER BY g.first, g.task_id
            """,
            *args,
        )
        docs: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            docs.setdefault(r["task_id"], []).append(r["trace"])
        out = []
        for task_id, group_docs in docs.items():
            traces = await asyncio.gather(*(self._trace(d, resolve_blobs) for d in group_docs))
            out.append(Group(task_id=task_id, policy=policy, traces=list(traces)))
        return out


def _summary(r: asyncpg.Record) -> TraceSummary:
    data = dict(r)
    data["policy"] = PolicyRef(name=data.pop("policy_name"), version=data.pop("policy_version"))
    return TraceSummary.model_validate(data)
