"""The table of a suite eval (`conductor eval --suite`), shaped as the paper's: one row per
system, one accuracy column per benchmark, their average, then tokens and cost per task, and a
last row with the published figures for reference.

The average is the unweighted mean of the benchmark columns, as the paper averages them: AIME's
30 problems count as much as MATH500's 500. A benchmark's accuracy is `system_row`'s (untrusted
verdicts and failed runs set aside, engine/eval/report.py): a cell over fewer runs because some
failed is marked `*`, and one with no completed run shows "—". Tokens and cost are per task over
every run of the system. A published figure the suite does not give is shown as "—", and the
published average only when every column has one (an average of some columns is not the
paper's average).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from pydantic import BaseModel, Field

from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.contracts.traces import Trace
from conductor_engine.engine.eval.report import BEST, MARK, SINGLE, system_order, system_row
from conductor_engine.engine.eval.systems import system_of
from conductor_engine.engine.tasks.suite import Suite

MISSING = "—"


class SuiteRow(BaseModel):
    """One system's line of the suite table (the `suite.json` row)."""

    system: str
    accuracy: dict[str, float | None] = Field(
        description="benchmark key -> accuracy (0..1); None where the system has no run")
    average: float | None = Field(description="mean of the benchmark accuracies")
    tasks: int
    untrusted: int = 0
    failed: dict[str, int] = Field(default_factory=dict, description="benchmark key -> runs "
                                   "with no result (failed, cancelled), kept out of accuracy")
    tokens_per_task: float | None = None
    cost_per_task: float | None = None
    published: bool = Field(default=False, description="the paper's figures, not a run")


def suite_rows(suite: Suite, traces: list[Trace]) -> list[SuiteRow]:
    """A row per system (the conductor first, then the single agents, `best single` by
    average, the other baselines), then the published row where the suite gives figures."""
    keys = [b.key for b in suite.benchmarks]
    grouped: dict[str, dict[str, list[Trace]]] = defaultdict(lambda: defaultdict(list))
    for t in traces:
        grouped[system_of(t.task.id)][t.task.dataset or ""].append(t)
    present = [k for k in keys if any(k in by for by in grouped.values())]
    rows = []
    for system, by_key in grouped.items():
        accuracy: dict[str, float | None] = {}
        failed: dict[str, int] = {}
        untrusted = 0
        for k in present:
            if by_key.get(k):
                r = system_row(system, by_key[k])
                accuracy[k] = r.accuracy
                untrusted += r.untrusted
                if r.failed:
                    failed[k] = r.failed
            else:
                accuracy[k] = None
        runs = [t for ts in by_key.values() for t in ts]
        whole = system_row(system, runs)
        rows.append(SuiteRow(system=system, accuracy=accuracy, average=_mean(accuracy),
                             tasks=len(runs), untrusted=untrusted, failed=failed,
                             tokens_per_task=whole.tokens_per_task,
                             cost_per_task=whole.cost_per_task))
    rows.sort(key=lambda r: system_order(r.system))
    singles = [r for r in rows if r.system.startswith(SINGLE)]
    if singles:
        best = max(singles, key=lambda r: (not r.failed,
                                           -1.0 if r.average is None else r.average))
        rows.insert(rows.index(singles[-1]) + 1, revised(
            best, system=f"{BEST} ({best.system.removeprefix(SINGLE)})"))
    published = suite.published()
    if published:
        figures: dict[str, float | None] = {k: published.get(k) for k in present}
        rows.append(SuiteRow(system=suite.reference, accuracy=figures,
                             average=_mean(figures), tasks=0, published=True))
    return rows


def _mean(accuracy: dict[str, float | None]) -> float | None:
    values = list(accuracy.values())
    if not values or any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None) / len(values)


def header(suite: Suite, rows: list[SuiteRow]) -> tuple[str, ...]:
    names = {b.key: b.name for b in suite.benchmarks}
    keys = list(rows[0].accuracy) if rows else []
    return ("system", *(names[k] for k in keys), "average", "tokens / task", "$ / task")


def _percent(value: float | None) -> str:
    return MISSING if value is None else f"{100 * value:.1f}"


def cells(row: SuiteRow) -> tuple[str, ...]:
    """Accuracies in percent with one decimal, as the paper prints them; `*` on a cell (and
    the average) over fewer runs because some failed."""
    accuracy = [_percent(v) + (MARK if row.failed.get(k) and v is not None else "")
                for k, v in row.accuracy.items()]
    average = _percent(row.average) + (MARK if row.failed and row.average is not None else "")
    tokens = MISSING if row.tokens_per_task is None else f"{row.tokens_per_task:,.0f}"
    cost = MISSING if row.cost_per_task is None else f"{row.cost_per_task:.5f}"
    return (row.system, *accuracy, average, tokens, cost)


def failure_note(rows: list[SuiteRow]) -> str | None:
    """What `*` means under the table, with the number of failed runs; None without any."""
    failed = sum(sum(r.failed.values()) for r in rows if not r.system.startswith(BEST))
    if not failed:
        return None
    return (f"{MARK} over the runs that completed: {failed} run(s) failed and are not counted "
            f"as wrong ({MISSING}: none completed); the eval's table counts them per system")


def markdown(name: str, suite: Suite, rows: list[SuiteRow]) -> str:
    head = header(suite, rows)
    lines = [f"# Eval {name}: suite {suite.name}", "",
             "Accuracy in %; the average is the mean of the benchmark columns.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    note = failure_note(rows)
    if note:
        lines += ["", note]
    if any(r.published for r in rows):
        lines += ["", f"The last row is published, not measured here: {suite.citation}"
                  f" ({MISSING}: a figure this suite does not give)."]
    return "\n".join(lines) + "\n"


def write_suite_report(name: str, suite: Suite, rows: list[SuiteRow], out_dir: Path
                       ) -> list[Path]:
    """suite.md (the paper-shaped table) and suite.json (its rows)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md, js = out_dir / "suite.md", out_dir / "suite.json"
    md.write_text(markdown(name, suite, rows))
    js.write_text(json.dumps([r.model_dump() for r in rows], indent=2) + "\n")
    return [md, js]
