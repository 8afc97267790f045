"""What the benchmark scripts share: a private Temporal dev server and scripted agent server,
quiet logs, repeated timing with medians, plain tables, and a breakdown of where a run's time
went, read back from its Temporal history.

Nothing here is a test; the scripts in this folder import it.
"""

from __future__ import annotations

import argparse
import asyncio
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

from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.runtime.client import connect_temporal
from conductor_engine.engine.runtime.embedded import EmbeddedTemporal
from conductor_engine.engine.runtime.logging import configure_logging
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.database import EmbeddedPostgres
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from tests.agent_server import AgentServer, start_agent_server

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


def add_common_args(parser: argparse.ArgumentParser, latency: float) -> None:
    parser.add_argument("--runs", type=int, default=5, help="measured runs per kind (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up runs per kind (default 1)")
    parser.add_argument("--latency", type=float, default=latency,
                        help=f"every agent's latency in seconds (default {latency:g})")


@contextmanager
def stack() -> Iterator[Stack]:
    """A real Temporal dev server on free ports in a temporary directory, and the scripted agent
    server; both are stopped on the way out, on an error, Ctrl-C or SIGTERM alike (see `run`)."""
    os.environ.setdefault(KEY_ENV, "sk-bench")
    with tempfile.TemporaryDirectory(prefix="conductor-bench-") as tmp:
        temporal = EmbeddedTemporal(Path(tmp) / "temporal", free_port(), free_port(),
                                    in_memory=bool(os.environ.get("BENCH_TEMPORAL_IN_MEMORY")))
        postgres = EmbeddedPostgres(Path(tmp) / "data")
        started = time.monotonic()
        try:
            temporal.start(detached=False)
            database_url = postgres.start()
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
            postgres.stop()


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
        print("\ninterrupted; the dev server was stopped", file=sys.stderr)
        return 130


def bench_pool(agents: AgentServer, agent_ids: Sequence[str]) -> Pool:
    """Agents on the scripted server in the OpenAI wire format, and an OpenAI-compatible
    conductor there too (as a vLLM-served conductor would be)."""
    return Pool.model_validate({
        "conductor": {"id": "conductor", "provider": "openai-compatible", "model": "conductor",
                      "base_url": agents.openai_base_url, "description": "the conductor"},
        "agents": [
            {"id": a, "provider": "openai", "model": a, "api_key_env": KEY_ENV,
             "base_url": agents.openai_base_url, "description": f"benchmark agent {a}"}
            for a in agent_ids
        ],
    })


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
    kinds: Mapping[str, Callable[[], Awaitable[str]]], runs: int, warmup: int = 1
) -> dict[str, Series]:
    """Run each kind `warmup + runs` times, interleaved (a, b, c, a, b, c, ...) so that a slow
    patch of the shared machine hits every kind alike. Each callable runs one workflow to its
    end and returns its workflow id; warm-up runs are not recorded."""
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


# ------------------------------------------------------------------------------ where time goes

# Each instant of a workflow's life (its first to its last history event) is given to the first
# of these that covers it: an activity executing on a worker, an activity waiting in its queue,
# a workflow task executing on a worker (the workflow code, in its sandbox), a workflow task
# waiting in its queue; what is left is the server between events.
PHASES = ("activity running", "activity queued", "wf task running", "wf task queued", "server")

_ET = EventType
_OPEN = {
    _ET.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: "activity",
    _ET.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED: "wf task",
}
_START = {_ET.EVENT_TYPE_ACTIVITY_TASK_STARTED, _ET.EVENT_TYPE_WORKFLOW_TASK_STARTED}
_CLOSE = {
    _ET.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, _ET.EVENT_TYPE_ACTIVITY_TASK_FAILED,
    _ET.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT, _ET.EVENT_TYPE_ACTIVITY_TASK_CANCELED,
    _ET.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, _ET.EVENT_TYPE_WORKFLOW_TASK_FAILED,
    _ET.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT,
}


def _scheduled_id(event: Any) -> int:
    """The id of the Scheduled event a Started or closing event belongs to."""
    which = event.WhichOneof("attributes")
    return int(getattr(event, which).scheduled_event_id)


async def phases(client: Client, workflow_id: str) -> dict[str, float]:
    """Seconds spent in each of PHASES, plus "server span" (first to last event), "activities"
    and "wf tasks" (counts), read from the run's history."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    events = list(history.events)
    t = {e.event_id: e.event_time.ToMicroseconds() / 1e6 for e in events}
    intervals: list[tuple[float, float, str]] = []
    kinds: dict[int, str] = {}
    started: dict[int, int] = {}
    for e in events:
        if e.event_type in _OPEN:
            kinds[e.event_id] = _OPEN[e.event_type]
        elif e.event_type in _START:
            started[_scheduled_id(e)] = e.event_id
        elif e.event_type in _CLOSE:
            sched = _scheduled_id(e)
            kind = kinds[sched]
            start = started.get(sched)
            if start is not None:
                intervals.append((t[sched], t[start], f"{kind} queued"))
                intervals.append((t[start], t[e.event_id], f"{kind} running"))
    first, last = t[events[0].event_id], t[events[-1].event_id]
    edges = sorted({first, last, *(a for a, _, _ in intervals), *(b for _, b, _ in intervals)})
    out = dict.fromkeys(PHASES, 0.0)
    for a, b in zip(edges, edges[1:], strict=False):
        covering = {name for lo, hi, name in intervals if lo <= a and b <= hi}
        phase = next((p for p in PHASES if p in covering), "server")
        out[phase] += b - a
    out["server span"] = last - first
    out["activities"] = float(sum(1 for k in kinds.values() if k == "activity"))
    out["wf tasks"] = float(sum(1 for k in kinds.values() if k == "wf task"))
    return out


async def mean_phases(client: Client, s: Series) -> dict[str, float]:
    """PHASES averaged over a series' runs, with "client" = wall time - server span (starting
    the workflow and receiving its result, on the client's side)."""
    per_run = await asyncio.gather(*(phases(client, w) for w in s.workflow_ids))
    keys = list(per_run[0])
    mean = {k: statistics.fmean(p[k] for p in per_run) for k in keys}
    mean["client"] = statistics.fmean(
        wall - p["server span"] for wall, p in zip(s.seconds, per_run, strict=True)
    )
    mean["wall"] = statistics.fmean(s.seconds)
    return mean


def phase_table(rows: Sequence[tuple[str, dict[str, float]]]) -> str:
    """Mean ms per phase for each run kind, and each kind's difference from the first."""
    cols = ["wall", "client", "server span", *PHASES]
    headers = ["run kind", *[f"{c} ms" for c in cols], "acts", "wf tasks"]
    body: list[list[Any]] = []
    for name, p in rows:
        body.append([name, *[ms(p[c]) for c in cols], f"{p['activities']:.0f}",
                     f"{p['wf tasks']:.0f}"])
    base_name, base = rows[0]
    for name, p in rows[1:]:
        body.append([f"{name} - {base_name}", *[f"{(p[c] - base[c]) * 1000:+.0f}" for c in cols],
                     f"{p['activities'] - base['activities']:+.0f}",
                     f"{p['wf tasks'] - base['wf tasks']:+.0f}"])
    return table(headers, body)


PHASE_LEGEND = (
    "Phases, from each run's Temporal history (means over the measured runs): client = wall "
    "time outside\nthe workflow's first..last event (start call and result delivery); "
    "activity running = an activity\nexecuting on the worker (its call, or its sleep, plus "
    "SDK work); activity queued = scheduled, not yet\npicked up; wf task running/queued = the "
    "same for workflow tasks (workflow code in its sandbox);\nserver = none of those (time "
    "between events inside the server). Each instant counts once, in the\nfirst phase that "
    "covers it, so overlapping parallel activities count once."
)

