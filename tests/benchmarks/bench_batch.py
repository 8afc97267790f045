"""Batch throughput: 1,000 three-step tasks at concurrency 100 against the ideal.

    python -m tests.benchmarks.bench_batch [--tasks 1000] [--concurrency 100] [--latency 0.5]

Engine: one BatchWorkflow (runtime.client.ConductorClient.submit_batch) on the engine's
own worker, every task a
child ConductWorkflow: an immediate 3-step chain plan (step i reads step i-1), each agent called
over the OpenAI SDK and answering after `--latency` seconds, then the score and record
activities (each task has a reference; traces go to PostgreSQL). The report is written after the
timed part.

Set BENCH_TEMPORAL_IN_MEMORY=1 to run the dev server without its SQLite file (its commits are
then not on the critical path; nothing else changes).

Baselines, both in the same run:
- ideal: tasks x critical path / concurrency, the critical path being 3 x latency (the plan,
  scoring and recording are counted as engine overhead); goal wall / ideal <= 1.3.
- bare Temporal (tests/benchmarks/_bare_batch.py): a parent workflow starting one child per
  task at the same concurrency, each child the same activities (plan, 3 steps, score, record)
  as plain activities that only sleep what the engine's take here, on its own worker in this
  process, on the same dev server. The engine's throughput over the bare one (goal >= 0.8)
  separates the engine's cost from the dev server's and the machine's: the ratio to the ideal
  holds both.
Also printed: the CPU seconds per step spent by this process (worker and client) and by the
Temporal dev server, for each.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path

import psutil
from temporalio.client import Client
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import (
    SandboxedWorkflowRunner,
    SandboxRestrictions,
)

from conductor_engine.engine.contracts.names import (
    batch_child_workflow_id,
    batch_workflow_id,
)
from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.storage.batch_report import write_report
from conductor_engine.engine.storage.shared_store import close_shared_stores, shared_store
from conductor_engine.runtime.client import ConductorClient
from conductor_engine.runtime.worker import build_worker
from tests.agent_server import start_agent_server
from tests.benchmarks import _bare_batch
from tests.benchmarks._bare_batch import (
    BareBatch,
    BareBatchInput,
    BareTask,
    BareTaskInput,
    bare_sleep,
)
from tests.benchmarks._harness import (
    answer_after,
    bench_pool,
    ms,
    quiet_logs,
    run,
    stack,
    table,
)
from tests.benchmarks._phases import PHASES, phases

PLAN = ('{"steps": [{"agent": "a", "subtask": "Read the question.", "access": []}, '
        '{"agent": "b", "subtask": "Work it out.", "access": [0]}, '
        '{"agent": "c", "subtask": "State the answer.", "access": [1]}]}')
STEPS = 3
AGENTS = ["a", "b", "c"]


def _plan(prompt: str) -> str:
    return PLAN


def serve_agents(latency: float, urls: Queue[str], stop: Event) -> None:
    """The scripted agents in a process of their own, as remote agents are: sharing the
    worker's interpreter (and its GIL) would bill their HTTP handling to the engine."""
    with start_agent_server() as agents:
        agents.set_responder("conductor", _plan)
        answer_after(agents, AGENTS, latency, "42")
        urls.put(agents.openai_base_url)
        stop.wait()


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


async def _bare(client: Client, args: argparse.Namespace, server: psutil.Process | None
                 ) -> tuple[float, float, float]:
    """The bare baseline's wall seconds, this process's CPU seconds and the server's."""
    queue = f"bench-bare-{uuid.uuid4().hex[:6]}"
    runner = SandboxedWorkflowRunner(  # the module is imported once, as the engine's models are
        restrictions=SandboxRestrictions.default.with_passthrough_modules(_bare_batch.__name__))
    tasks = [BareTaskInput(task_id=f"t{i:05d}", plan_s=0.0, step_s=args.latency, steps=STEPS,
                           score_s=0.0, record_s=0.0) for i in range(args.tasks)]
    async with Worker(client, task_queue=queue, workflows=[BareBatch, BareTask],
                      activities=[bare_sleep], workflow_runner=runner,
                      max_concurrent_activities=1000):
        cpu0, srv0 = time.process_time(), server.cpu_times() if server else None
        started = time.perf_counter()
        done = await client.execute_workflow(
            BareBatch.run, BareBatchInput(tasks=tasks, concurrency=args.concurrency),
            id=f"bare-{uuid.uuid4().hex[:6]}", task_queue=queue)
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu0
        srv = (sum(server.cpu_times()[:2]) - sum(srv0[:2])) if server and srv0 else 0.0
    assert done == args.tasks
    return wall, cpu, srv


async def _bench(args: argparse.Namespace, agents_url: str) -> int:
    with stack() as s:  # its own agent server stays idle: the agents answer from agents_url
        client = await s.client()
        settings = s.queue("batch")
        pool = bench_pool(agents_url, AGENTS)
        conductor = ConductorClient(client, settings, pool)
        tasks = [Task(id=f"t{i:05d}", question=f"Question {i}?", reference="42")
                 for i in range(args.tasks)]
        server = psutil.Process(s.temporal.process.pid) if s.temporal.process else None
        async with build_worker(client, settings, pool,
                                max_concurrent_activities=1000):
            await shared_store(settings)  # connect and migrate before the clock starts
            name = f"bench-{uuid.uuid4().hex[:6]}"
            cpu0, srv0 = time.process_time(), server.cpu_times() if server else None
            started = time.perf_counter()
            await conductor.submit_batch(name, tasks, concurrency=args.concurrency,
                                         report=False)
            handle = client.get_workflow_handle(batch_workflow_id(name))
            progress = await handle.result()
            wall = time.perf_counter() - started
            cpu = time.process_time() - cpu0
            srv = (sum(server.cpu_times()[:2]) - sum(srv0[:2])) if server and srv0 else 0.0
            every = max(1, len(tasks) // 20)
            sample = [batch_child_workflow_id(name, t.id) for t in tasks[::every]]
            per_child = await asyncio.gather(*(phases(client, w) for w in sample))
            store = await shared_store(settings)
            traces = await store.batch_traces(name)
            t = time.perf_counter()
            write_report(name, traces, Path(settings.data_dir) / "batches" / name)
            report_s = time.perf_counter() - t
        await close_shared_stores()
        bare_wall, bare_cpu, bare_srv = await _bare(client, args, server)
    ideal = args.tasks * STEPS * args.latency / args.concurrency
    steps = args.tasks * STEPS
    print(f"batch of {args.tasks} tasks x {STEPS} steps at {args.latency * 1000:.0f} ms, "
          f"concurrency {args.concurrency}: completed {progress['completed']}, "
          f"failed {progress['failed']}, continued-as-new {progress['continued']}x")
    print(f"wall {wall:.1f}s · ideal {ideal:.1f}s (tasks x critical path / concurrency) · "
          f"ratio {wall / ideal:.2f} (goal <= 1.3)")
    print(f"bare Temporal, the same activities and children: wall {bare_wall:.1f}s "
          f"(ratio to the ideal {bare_wall / ideal:.2f}) · engine throughput / bare "
          f"{bare_wall / wall:.2f} (goal >= 0.8; {args.tasks / wall:.1f} vs "
          f"{args.tasks / bare_wall:.1f} tasks/s)")
    print(f"orchestration CPU per step: this process (worker + client) {cpu / steps * 1000:.1f} ms"
          f" · Temporal dev server {srv / steps * 1000:.1f} ms · on {os.cpu_count()} cores")
    print(f"the same for bare Temporal: this process {bare_cpu / steps * 1000:.1f} ms · "
          f"Temporal dev server {bare_srv / steps * 1000:.1f} ms")
    cores = os.cpu_count() or 1
    floor = (cpu + srv) / cores
    print(f"CPU floor on this machine: (worker + server CPU) / {cores} cores = {floor:.1f}s, "
          f"{floor / ideal:.2f} x the ideal: the best ratio these cores allow")
    print(f"report of {len(traces)} traces written in {report_s:.1f}s")
    print(f"where a task's time goes (mean ms over {len(per_child)} sampled child runs):")
    keys = ["server span", *PHASES]
    print(table([k + " ms" for k in keys],
                [[ms(statistics.fmean(p[k] for p in per_child)) for k in keys]]))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--latency", type=float, default=0.5)
    args = parser.parse_args()
    sys.exit(run(lambda: main(args)))
