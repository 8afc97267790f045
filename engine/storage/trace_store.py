"""The trace store: traces in PostgreSQL (asyncpg), large texts in the blob store.

Writes are upserts keyed by (workflow id, run id): a record activity that is retried, or a
workflow replayed, writes the same row again instead of a second one. Any string in a trace
longer than the blob threshold (an agent's 5 MB output, a long prompt) is replaced in the stored
document by `{"$blob": "sha256:...", "bytes": n, "preview": "..."}` and put in the blob store;
reads put the text back unless asked not to. Content that merely looks like such a reference
stays data (blob_refs.py). So does any text PostgreSQL cannot hold (a NUL, a lone surrogate: a
sampling model writes both), whatever its length, so every trace is written and reads back as
the run had it.

A row PostgreSQL refuses for good (REJECTED) raises TraceRejected, which the record activity
does not retry; anything else (an unreachable server, a lost connection) is worth a retry.

The trainer reads *groups*: the G oldest root traces of one task under one policy version,
complete once G runs have finished, whatever their status (`group_runs`). The store reads them
and says nothing of them: which are honest rollouts, and whether they form a group, is
engine/rewards/rollouts.py's to decide.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any, get_args

import asyncpg
import structlog
from pydantic import BaseModel, Field
from pydantic_core import PydanticSerializationError

from conductor_engine.engine.contracts.names import BASELINE_POLICY
from conductor_engine.engine.contracts.traces import (
    PolicyRef,
    StoredGroup,
    StoredRun,
    Trace,
    TraceStatus,
)
from conductor_engine.engine.storage.blob_refs import (
    blob_text,
    decode,
    encode,
    may_hold_blob_keys,
    may_hold_nul,
    refs_in,
    storable_text,
)
from conductor_engine.engine.storage.blobs import BlobCorrupt, BlobStore
from conductor_engine.engine.storage.database import connect_pool

log = structlog.get_logger(__name__)

UNREADABLE = (BlobCorrupt, LookupError, TypeError, ValueError)
"""What reading one trace raises when the trace itself is bad: a missing or corrupt blob, a
document that does not validate (pydantic's ValidationError and UnicodeDecodeError are
ValueErrors). A blob store or database that cannot be reached raises something else, and a
retry is the right answer to that."""

REJECTED = (
    asyncpg.DataError,  # class 22: a value PostgreSQL cannot take (range, encoding, format)
    asyncpg.IntegrityConstraintViolationError,  # class 23: a constraint the row breaks
    asyncpg.ProgramLimitExceededError,  # class 54: an oversized value or row
    asyncpg.exceptions._base.DataError,  # asyncpg's own: an argument it cannot encode
)
"""What writing a trace raises when the row itself is refused: the same row fails every time,
so the record activity must not retry it. Everything else is the store being unavailable."""


class TraceRejected(Exception):
    """PostgreSQL refused a trace's row for good; str(error) says which run and why."""


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0][:300]


def _column_text(value: str | None) -> str | None:
    """A text column's value as PostgreSQL can hold it (blob_refs.storable_text): the
    document beside it keeps the exact text."""
    return None if value is None else storable_text(value)


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

        def add(sql: str, value: Any) -> None:  # text as the column holds it (storable_text)
            args.append(storable_text(value) if isinstance(value, str) else value)
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


SCORED_ROOT_RUNS = (
    "depth = 0 AND NOT superseded AND status = 'completed' AND reward IS NOT NULL "
    "AND task_id = ANY($1) "
    # a verdict the candidate could have forged never counts (code_tests.UNTRUSTED)
    "AND (trace #>> '{reward,verdict,details,trusted}') IS DISTINCT FROM 'false'")
"""The runs a warm-up may read (`best_runs`, `scored_runs`): finished root runs of the tasks
in $1 with a reward whose verdict was not forgeable."""


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
        """Insert or replace the trace's row: the same (workflow id, run id) is one row.
        Raises TraceRejected when PostgreSQL refuses the row itself (REJECTED), which no retry
        can change; anything else (an unreachable server, a lost connection) is worth a retry."""
        row = await self.row(trace)
        try:
            await self.pool.execute(_UPSERT, *row)
        except REJECTED as e:
            raise TraceRejected(
                f"PostgreSQL rejected the trace of workflow {trace.workflow_id} run "
                f"{trace.run_id} ({type(e).__name__}: {_first_line(e)}); retrying cannot help, "
                "so the trace is not written: report this with the workflow id"
            ) from e

    async def row(self, trace: Trace) -> tuple[Any, ...]:
        """The row's values in _UPSERT's order, large texts and texts PostgreSQL cannot hold
        moved to the blob store. A document no longer than the threshold cannot hold a longer
        text, and one with no key to escape and no NUL goes as it is, unwalked (the common
        case); one that cannot even be serialised holds a lone surrogate, and is walked."""
        doc: bytes | dict[str, Any]
        try:
            doc = trace.document_json()
            walk = len(doc) > self.blob_threshold or may_hold_blob_keys(doc) or may_hold_nul(doc)
        except PydanticSerializationError:  # no UTF-8 encoder takes a lone surrogate
            walk = True
        if walk:
            encoded = encode(trace.document(), threshold=self.blob_threshold)
            await asyncio.gather(*(self.blobs.put(data) for data in encoded.blobs.values()))
            doc = encoded.doc
        verdict = trace.reward.verdict if trace.reward else None
        usage = trace.totals.usage
        col = _column_text
        return (
            col(trace.workflow_id), col(trace.run_id), col(trace.parent_workflow_id),
            trace.depth, col(trace.task.id), col(trace.task.dataset),
            [storable_text(t) for t in trace.task.tags], col(trace.policy.name),
            col(trace.policy.version), trace.status,
            trace.reward.value if trace.reward else None,
            verdict.correct if verdict else None, col(verdict.verifier if verdict else None),
            usage.input_tokens, usage.output_tokens, trace.totals.cost_usd, trace.totals.seconds,
            trace.started_at, trace.finished_at, trace.schema_version, doc, col(trace.task.batch),
        )

    # --- reading ---------------------------------------------------------------------------

    async def _document(self, doc: dict[str, Any], resolve_blobs: bool) -> dict[str, Any]:
        """The stored document as written: its blobs fetched (concurrently), keys unescaped."""
        if not resolve_blobs:
            return decode(doc, None)
        refs = sorted(refs_in(doc))
        data = await asyncio.gather(*(self.blobs.get(r) for r in refs))
        return decode(doc, {r: blob_text(d) for r, d in zip(refs, data, strict=True)})

    async def _trace(self, doc: dict[str, Any], resolve_blobs: bool) -> Trace:
        return Trace.from_document(await self._document(doc, resolve_blobs))

    async def get(
        self, workflow_id: str, run_id: str | None = None, *, children: bool = True,
        resolve_blobs: bool = True,
    ) -> Trace | None:
        """One trace (the latest run of the workflow unless run_id is given), with its
        self-call traces nested under `children`, recursively. Ids are looked up as their
        columns hold them (storable_text)."""
        workflow_id, run_id = storable_text(workflow_id), run_id and storable_text(run_id)
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

    async def group_runs(
        self,
        policy: PolicyRef,
        *,
        size: int,
        limit: int = 4,
        dataset: str | None = None,
        statuses: tuple[str, ...] = get_args(TraceStatus),
        unconsumed: bool = False,
        task_ids: list[str] | None = None,
    ) -> list[StoredGroup]:
        """Up to `limit` complete groups: tasks with at least `size` root runs under this
        policy version, each group its `size` oldest runs. Two indexed queries.

        A group is complete once `size` runs have finished, failed ones included (every run
        records a trace); which of them are rollouts is then decided per run
        (rewards/rollouts.py `rollout_group`), so a group may turn out too small to train on
        (`Group.trainable`): the trainer still consumes it, so that it is not chosen again.

        `unconsumed` leaves out traces an update already decided on (the trainer's view);
        `task_ids` keeps only those tasks."""
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
            SELECT g.task_id, r.workflow_id, r.run_id, r.trace FROM g CROSS JOIN LATERAL (
                SELECT workflow_id, run_id, finished_at, trace FROM traces
                WHERE {base} AND traces.task_id = g.task_id
                ORDER BY finished_at, workflow_id LIMIT $4) r
            ORDER BY g.first, g.task_id, r.finished_at, r.workflow_id
            """,
            *args,
        )
        by_task: dict[str, list[asyncpg.Record]] = {}
        for r in rows:
            by_task.setdefault(r["task_id"], []).append(r)
        out = []
        for task_id, group_rows in by_task.items():
            runs = await asyncio.gather(*(self._stored_run(r) for r in group_rows))
            out.append(StoredGroup(task_id=task_id, policy=policy, runs=list(runs)))
        return out

    async def best_runs(
        self, task_ids: list[str], *, per_task: int, min_reward: float = 0.0,
        correct_only: bool = False, policies: list[str] | None = None,
    ) -> list[StoredRun]:
        """Up to `per_task` completed root runs of each of these tasks with a reward of at
        least `min_reward`, best first: reward descending, then cost ascending, then the
        earlier run (the warm-up's candidates, trainer/warmup.py, which decides which of them
        are honest). Only these task ids: a held-out task's runs (`heldout~ID`) are never
        among them. `correct_only`: runs whose verdict said right; `policies`: runs these
        conductors planned. Never a fixed plan's run (policy `baseline`: no conductor wrote
        it, so there is nothing to learn from it). One indexed query; only the ranked rows'
        documents are read."""
        args: list[Any] = [task_ids, min_reward, per_task, BASELINE_POLICY]
        where = f"{SCORED_ROOT_RUNS} AND reward >= $2 AND policy_name <> $4"
        if correct_only:
            where += " AND correct"
        if policies is not None:
            args.append(policies)
            where += f" AND policy_name = ANY(${len(args)})"
        rows = await self.pool.fetch(
            f"""
            SELECT workflow_id, run_id, trace FROM (
                SELECT workflow_id, run_id, trace, task_id, row_number() OVER (
                    PARTITION BY task_id ORDER BY reward DESC, cost_usd, finished_at,
                    workflow_id) AS rank
                FROM traces WHERE {where}) ranked
            WHERE rank <= $3 ORDER BY task_id, rank
            """,
            *args,
        )
        return list(await asyncio.gather(*(self._stored_run(r) for r in rows)))

    async def scored_runs(
        self, task_ids: list[str], *, per_task: int, policies: list[str] | None = None,
        batch: str | None = None,
    ) -> list[StoredRun]:
        """The newest `per_task` completed, scored root runs of each of these tasks, right and
        wrong alike (the warm-up's evidence of each plan's mean reward, trainer/warmup.py, which
        decides which of them are honest), by task, newest first. Only these task ids: a
        held-out task's runs (`heldout~ID`) are never among them; none whose verdict the
        candidate could have forged. `policies`: runs these conductors planned, and with
        `batch` also every run of that batch (a training run's rehearsals, whose fixed plans
        are recorded under the policy `baseline`). One indexed query."""
        args: list[Any] = [task_ids, per_task]
        where = SCORED_ROOT_RUNS
        if policies is not None:
            args.append(policies)
            who = f"policy_name = ANY(${len(args)})"
            if batch is not None:
                args.append(batch)
                who += f" OR batch = ${len(args)}"
            where += f" AND ({who})"
        rows = await self.pool.fetch(
            f"""
            SELECT workflow_id, run_id, trace FROM (
                SELECT workflow_id, run_id, trace, task_id, row_number() OVER (
                    PARTITION BY task_id ORDER BY finished_at DESC, workflow_id) AS rank
                FROM traces WHERE {where}) ranked
            WHERE rank <= $2 ORDER BY task_id, rank
            """,
            *args,
        )
        return list(await asyncio.gather(*(self._stored_run(r) for r in rows)))

    async def _stored_run(self, row: asyncpg.Record) -> StoredRun:
        """One run of a group, read back; a trace that cannot be read comes back with why (and
        is logged) rather than raised, so the caller can leave it out of its group."""
        wid, rid = row["workflow_id"], row["run_id"]
        try:
            trace = await self._trace(row["trace"], resolve_blobs=True)
        except UNREADABLE as e:
            detail = f"{type(e).__name__}: {e}"
            log.warning("trace left out of its group: unreadable", workflow_id=wid, run_id=rid,
                        error=detail)
            return StoredRun(workflow_id=wid, run_id=rid, error=detail)
        return StoredRun(workflow_id=wid, run_id=rid, trace=trace)


def _summary(r: asyncpg.Record) -> TraceSummary:
    data = dict(r)
    data["policy"] = PolicyRef(name=data.pop("policy_name"), version=data.pop("policy_version"))
    return TraceSummary.model_validate(data)
