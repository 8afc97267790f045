"""The comparison `conductor eval` prints: one row per system, from the traces of its runs.

Read from the trace store, not from workflow state, so an eval resumed after a crash, or
submitted again, reports every run. A run that completed without a verdict (no reference)
counts as wrong, as in the batch report.

A run that failed has no result (`no_result`, engine/storage/batch_report.py: an agent's call
failed after its retries, a key not set, a server unreachable, the verifier failed, the run was
cancelled): it is counted in `failed`, never as a wrong answer, since it says nothing of what
the system answers. Accuracy is over the runs that completed; a row with failed runs is marked
(`*`) with the count beside it, and a system none of whose runs completed shows `n/a`, never
0.000 (a real zero and an outage must not look alike).

An untrusted verdict (assert-style code tests, which run inside the candidate's process and
which it can forge: `code_tests.UNTRUSTED`) is counted apart, never as correct: `accuracy` and
`mean_reward` are over the other runs, and `untrusted` says how many were set aside. Tokens,
cost, latency and calls are over every run: those were spent either way.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from conductor_engine.engine.contracts.names import BASELINE_POLICY
from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.contracts.traces import Trace
from conductor_engine.engine.eval.systems import CONDUCTOR, system_of
from conductor_engine.engine.storage.batch_report import no_result

SINGLE = "single "
BEST = "best single"


class SystemRow(BaseModel):
    """One system's figures, per task where it says so (the `--json` row)."""

    system: str
    tasks: int = Field(description="the system's runs: each task once per repeat of the eval")
    accuracy: float | None = Field(description="correct / (tasks - failed - untrusted); None "
                                   "when no run completed with a trusted verdict")
    mean_reward: float | None = Field(description="over the same runs as accuracy")
    failed: int = Field(default=0, description="runs with no result (an agent's call or the "
                        "verifier failed, the run was cancelled), kept out of accuracy")
    input_tokens_per_task: float
    output_tokens_per_task: float
    tokens_per_task: float
    cost_per_task: float
    p50_s: float
    p95_s: float
    calls_per_task: float
    delta_to_best_single: float | None = None
    untrusted: int = Field(default=0, description="runs whose verdict the candidate could have "
                           "forged (assert-style code tests), kept out of accuracy")


def _quantile(values: list[float], q: int) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _calls(t: Trace) -> int:
    """Model calls a run made: its conductor's plan attempts (none for a fixed plan) and
    its finished or failed steps."""
    plans = sum(1 for r in t.rounds for a in r.attempts if a.conductor_id != BASELINE_POLICY)
    return plans + sum(1 for s in t.steps if s.status in ("done", "failed"))


def untrusted(t: Trace) -> bool:
    """Whether the run's verdict says the candidate could have forged it (the mark
    `verify_code` sets, which training reads too: engine/rewards/rollouts.py)."""
    return bool(t.reward and t.reward.verdict and t.reward.verdict.untrusted)


def system_row(system: str, traces: list[Trace]) -> SystemRow:
    n = len(traces)
    completed = [t for t in traces if no_result(t) is None]
    judged = [t for t in completed if not untrusted(t)]
    correct = sum(bool(t.reward and t.reward.verdict and t.reward.verdict.correct)
                  for t in judged)
    rewards = [t.reward.value if t.reward and t.reward.value is not None else 0.0
               for t in judged]
    scored = len(judged)
    seconds = sorted(t.totals.seconds for t in traces)
    tokens_in = sum(t.totals.usage.input_tokens for t in traces)
    tokens_out = sum(t.totals.usage.output_tokens for t in traces)
    return SystemRow(
        system=system, tasks=n, accuracy=correct / scored if scored else None,
        mean_reward=sum(rewards) / scored if scored else None,
        failed=n - len(completed), untrusted=len(completed) - len(judged),
        input_tokens_per_task=tokens_in / n, output_tokens_per_task=tokens_out / n,
        tokens_per_task=(tokens_in + tokens_out) / n,
        cost_per_task=sum(t.totals.cost_usd for t in traces) / n,
        p50_s=_quantile(seconds, 50), p95_s=_quantile(seconds, 95),
        calls_per_task=sum(_calls(t) for t in traces) / n,
    )


def system_rows(traces: list[Trace]) -> list[SystemRow]:
    """A row per system in the order met, then `best single` (the single agent with the best
    accuracy, then mean reward, on these tasks), every row's accuracy delta to it."""
    by_system: dict[str, list[Trace]] = defaultdict(list)
    for t in traces:
        by_system[system_of(t.task.id)].append(t)
    rows = sorted((system_row(s, ts) for s, ts in by_system.items()), key=_order)
    singles = [r for r in rows if r.system.startswith(SINGLE)]
    judged = [r for r in singles if r.accuracy is not None]
    if judged:  # a whole row first: a few lucky runs among failures are not the best agent
        best = max(judged, key=lambda r: (not r.failed, r.accuracy or 0.0,
                                          r.mean_reward or 0.0))
        rows.insert(rows.index(singles[-1]) + 1, revised(
            best, system=f"{BEST} ({best.system.removeprefix(SINGLE)})"))
        for r in rows:
            if r.accuracy is not None and best.accuracy is not None:
                r.delta_to_best_single = r.accuracy - best.accuracy
    return rows


_RANK = {CONDUCTOR: 0, "single": 1, "moa": 3, "random": 4, "chain": 5}


def _order(row: SystemRow) -> tuple[int, str]:
    return system_order(row.system)


def system_order(system: str) -> tuple[int, str]:
    """The conductor (by rounds), the single agents, then the other baselines."""
    return _RANK.get(system.split(" ", 1)[0], 6), system


HEADER = ("system", "accuracy", "failed", "untrusted", "mean reward", "tokens in / task",
          "tokens out / task", "cost / task ($)", "p50 s", "p95 s", "calls / task",
          "Δ acc. vs best single")
"""`accuracy` and `mean reward` are over the runs that completed with a trusted verdict;
`failed` and `untrusted` count the rest."""

NOT_AVAILABLE = "n/a"
MARK = "*"


def _figure(value: float | None, r: SystemRow) -> str:
    """Accuracy or mean reward as shown: `n/a` when no run completed, marked `*` when some
    runs failed (over the others only), so neither reads as a plain result."""
    if value is None:
        return NOT_AVAILABLE
    return f"{value:.3f}" + (MARK if r.failed else "")


def cells(r: SystemRow) -> tuple[str, ...]:
    delta = "" if r.delta_to_best_single is None else f"{r.delta_to_best_single:+.3f}"
    return (r.system, _figure(r.accuracy, r), str(r.failed), str(r.untrusted),
            _figure(r.mean_reward, r),
            f"{r.input_tokens_per_task:,.0f}", f"{r.output_tokens_per_task:,.0f}",
            f"{r.cost_per_task:.5f}", f"{r.p50_s:.2f}", f"{r.p95_s:.2f}",
            f"{r.calls_per_task:.1f}", delta)


NARROW_HEADER = ("system", "accuracy", "reward", "tokens / task", "$ / task", "p50 s",
                 "Δ vs best")
"""The columns a narrow terminal shows (table.md and --json keep every one); the untrusted
count goes in the accuracy cell, "0.520 (3 untrusted)", when there are any."""

NARROW_FAILED_HEADER = ("system", "accuracy", "failed", "reward", "tokens / task", "$ / task",
                        "p50 s")
"""The narrow columns when some runs failed: the failed count beside accuracy, in the place of
the delta to the best single agent (table.md keeps it)."""


def narrow_header(rows: list[SystemRow]) -> tuple[str, ...]:
    return NARROW_FAILED_HEADER if any(r.failed for r in rows) else NARROW_HEADER


def narrow_cells(r: SystemRow, failed_column: bool = False) -> tuple[str, ...]:
    """One row of the narrow table; `failed_column`: of NARROW_FAILED_HEADER."""
    delta = "" if r.delta_to_best_single is None else f"{r.delta_to_best_single:+.3f}"
    accuracy = _figure(r.accuracy, r) + (f" ({r.untrusted} untrusted)" if r.untrusted else "")
    figures = (f"{r.tokens_per_task:,.0f}", f"{r.cost_per_task:.5f}", f"{r.p50_s:.2f}")
    if failed_column:
        return (r.system, accuracy, str(r.failed), _figure(r.mean_reward, r), *figures)
    return (r.system, accuracy, _figure(r.mean_reward, r), *figures, delta)


def failure_note(rows: list[SystemRow]) -> str | None:
    """The line under a table with failed runs: what `*` and `n/a` mean. None without any."""
    failed = sum(r.failed for r in rows if not r.system.startswith(BEST))
    if not failed:
        return None
    return (f"{MARK} over the runs that completed: {failed} run(s) failed (an agent's call "
            f"or the verifier failed, or the run was cancelled) and are not counted as wrong; "
            f"{NOT_AVAILABLE}: no run of that system completed")


def markdown(name: str, rows: list[SystemRow]) -> str:
    tasks = rows[0].tasks if rows else 0
    lines = [f"# Eval {name}: {tasks} tasks per system", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    note = failure_note(rows)
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def write_report(name: str, rows: list[SystemRow], out_dir: Path) -> list[Path]:
    """results.json, table.md and (with matplotlib, the train extra) accuracy.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "results.json", out_dir / "table.md"]
    written[0].write_text(json.dumps([r.model_dump() for r in rows], indent=2) + "\n")
    written[1].write_text(markdown(name, rows))
    chart = _bar_chart(name, rows, out_dir / "accuracy.png")
    return written + ([chart] if chart else [])


def _bar_chart(name: str, rows: list[SystemRow], path: Path) -> Path | None:
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(rows)), 4.0))
    systems = [r.system + (f" ({NOT_AVAILABLE})" if r.accuracy is None else
                           MARK if r.failed else "") for r in rows]
    ax.bar(systems, [r.accuracy or 0.0 for r in rows], color="#4C72B0")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.set_title(f"conductor eval {name}")
    ax.tick_params(axis="x", labelrotation=30)
    for label in ax.get_xticklabels():
        label.set_horizontalalignment("right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def rows_json(rows: list[SystemRow]) -> list[dict[str, Any]]:
    """The `--json` file: one object per system."""
    return [r.model_dump() for r in rows]
