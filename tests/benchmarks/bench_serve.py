"""`conductor serve` throughput: requests/s through the OpenAI-compatible server against the same
runs submitted directly through ConductorClient, in the same run.

    python -m tests.benchmarks.bench_serve [--requests 50] [--concurrency 10] [--latency 0.2]
                                           [--rounds 3]

Both sides run the same tasks (built by the server's own chat_task from the same messages) on
the same worker: an immediate 3-step chain plan, each agent answering after `--latency` seconds
over the OpenAI SDK from a process of its own, then the score and record activities. Served: the
official `openai` client, `--concurrency` requests at a time, against the app on uvicorn in this
process (as `conductor serve` runs it: its guarded protocol, an API key). Direct:
`ConductorClient.run` of the same tasks, as many at a time. The two alternate for `--rounds`
rounds (after one warm-up round each) so a slow patch of the shared machine hits both; printed:
each side's median requests/s and the ratio served / direct (goal >= 0.9: the HTTP layer adds
little to a run's cost).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from multiprocessing.queues import Queue

import httpx
import openai
import uvicorn

from conductor_engine.engine.storage.policies import PolicyRegistry
from conductor_engine.engine.storage.shared_store import close_shared_stores, shared_store
from conductor_engine.runtime.client import ConductorClient
from conductor_engine.runtime.serve.app import create_app
from conductor_engine.runtime.serve.catalog import ModelCatalog
from conductor_engine.runtime.serve.conversation import chat_task
from conductor_engine.runtime.serve.guard import ServeLimits, uvicorn_config
from conductor_engine.runtime.serve.wire import ChatRequest
from conductor_engine.runtime.worker import build_worker
from tests.benchmarks._harness import (
    bench_pool,
    free_port,
    quiet_logs,
    run,
    stack,
    table,
)
from tests.benchmarks.bench_batch import AGENTS, serve_agents

KEY = "sk-bench-serve"


async def _at_most(concurrency: int, jobs: list[Callable[[], Awaitable[object]]]) -> float:
    """Run every job, `concurrency` at a time; the wall seconds they took."""
    slots = asyncio.Semaphore(concurrency)

    async def one(job: Callable[[], Awaitable[object]]) -> None:
        async with slots:
            await job()

    started = time.perf_counter()
    await asyncio.gather(*(one(j) for j in jobs))
    return time.perf_counter() - started


async def main(args: argparse.Namespace) -> int:
    quiet_logs("error")
    ctx = multiprocessing.get_context("spawn")
    urls: Queue[str] = ctx.Queue()
    stop = ctx.Event()
    agents_process = ctx.Process(target=serve_agents, args=(args.latency, urls, stop))
    agents_process.start()
    agents_url = urls.get(timeout=60)
    try:
        return await _bench(args, agents_url)
    finally:
        stop.set()
        agents_process.join(10)


async def _bench(args: argparse.Namespace, agents_url: str) -> int:
    with stack() as s:
        client = await s.client()
        settings = s.queue("serve")
        pool = bench_pool(agents_url, AGENTS)
        conductor = ConductorClient(client, settings, pool)
        async with build_worker(client, settings, pool, max_concurrent_activities=1000):
            store = await shared_store(settings)  # connect and migrate before the clock starts
            catalog = ModelCatalog(pool.conductor.id, PolicyRegistry(store.pool).latest_version)
            port = free_port()
            server = uvicorn.Server(uvicorn_config(
                create_app(conductor, catalog, [KEY]), ServeLimits.of(settings),
                host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
            serving = asyncio.create_task(server.serve())
            while not server.started:
                await asyncio.sleep(0.02)
            limits = httpx.Limits(max_connections=args.concurrency * 2)
            api = openai.AsyncOpenAI(
                base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0,
                timeout=600, http_client=httpx.AsyncClient(limits=limits, timeout=600))
            try:
                rates = await _rounds(args, conductor, api)
            finally:
                server.should_exit = True
                await serving
        await close_shared_stores()
    served, direct = statistics.median(rates["served"]), statistics.median(rates["direct"])
    print(f"{args.requests} runs a round, {args.concurrency} at a time, each an immediate "
          f"3-step chain plan with agents at {args.latency * 1000:.0f} ms, scored and recorded; "
          f"{args.rounds} rounds each after a warm-up, alternating")
    print(table(["side", "median requests/s", "rounds"],
                [["direct (ConductorClient.run)", f"{direct:.2f}",
                  " ".join(f"{r:.2f}" for r in rates["direct"])],
                 ["served (openai client -> conductor serve)", f"{served:.2f}",
                  " ".join(f"{r:.2f}" for r in rates["served"])]]))
    print(f"served / direct requests/s: {served / direct:.2f} (goal >= 0.9)")
    return 0


async def _rounds(args: argparse.Namespace, conductor: ConductorClient,
                  api: openai.AsyncOpenAI) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {"direct": [], "served": []}
    for round_ in range(args.rounds + 1):
        tag = uuid.uuid4().hex[:6]
        messages = [[{"role": "user", "content": f"Question {tag}-{i}?"}]
                    for i in range(args.requests)]

        def direct_job(m: list[dict[str, str]]) -> Callable[[], Awaitable[object]]:
            task = chat_task(ChatRequest.model_validate({"model": "conductor",
                                                         "messages": m}), None)
            return lambda: conductor.run(task)

        def served_job(m: list[dict[str, str]]) -> Callable[[], Awaitable[object]]:
            return lambda: api.chat.completions.create(model="conductor",
                                                       messages=m)  # type: ignore[arg-type]

        for side, job in (("direct", direct_job), ("served", served_job)):
            wall = await _at_most(args.concurrency, [job(m) for m in messages])
            if round_ > 0:  # the first round warms both up
                rates[side].append(args.requests / wall)
            print(f"round {round_}{' (warm-up)' if round_ == 0 else ''}: {side} "
                  f"{args.requests / wall:.2f} requests/s", flush=True)
    return rates


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=50, help="runs a round, each side")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--latency", type=float, default=0.2, help="each agent's, in seconds")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds each side")
    args = parser.parse_args()
    sys.exit(run(lambda: main(args)))
