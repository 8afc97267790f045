"""Where a benchmark run's time went, read back from its Temporal history: each instant of the
workflow's life given to one phase (an activity running or queued, a workflow task running or
queued, the server between events), averaged over a series of runs, and printed as tables.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from tests.benchmarks._harness import Series, ms, table

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


async def print_phases(client: Client, series: Mapping[str, Series],
                       *tables: Sequence[str]) -> dict[str, dict[str, float]]:
    """Where the time goes: a phase table of each group of run kinds (the first of a group is
    the one the others are compared with), then the legend. The mean phases of every kind."""
    means = {name: await mean_phases(client, series[name]) for kinds in tables for name in kinds}
    print("Where the time goes (mean ms per run):")
    for kinds in tables:
        print(phase_table([(name, means[name]) for name in kinds]))
        print()
    print(PHASE_LEGEND)
    return means


PHASE_LEGEND = (
    "Phases, from each run's Temporal history (means over the measured runs): client = wall "
    "time outside\nthe workflow's first..last event (start call and result delivery); "
    "activity running = an activity\nexecuting on the worker (its call, or its sleep, plus "
    "SDK work); activity queued = scheduled, not yet\npicked up; wf task running/queued = the "
    "same for workflow tasks (workflow code in its sandbox);\nserver = none of those (time "
    "between events inside the server). Each instant counts once, in the\nfirst phase that "
    "covers it, so overlapping parallel activities count once."
)

