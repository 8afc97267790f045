"""A batch's report, from its traces: results JSONL, a summary (JSON and Markdown) and one
Markdown file per task with the answer and the step trail.

It is written from the trace store, not from workflow state, so a batch submitted twice (the
second submission skipping what the first completed) still reports every task, and
`conductor batch report NAME` can rewrite it at any time.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from conductor_engine.engine.contracts.agent_calls import Citation
from conductor_engine.engine.contracts.plans import sees_label
from conductor_engine.engine.contracts.traces import Trace
from conductor_engine.engine.rewards.rollouts import LeftOutReason, left_out_reason

NO_RESULT: frozenset[LeftOutReason] = frozenset(
    {"step_failed", "plan_failed", "run_failed", "cancelled", "verifier_error"})
"""Why a run has no result to count (engine/rewards/rollouts.py's reasons): an agent's call
failed after its retries (a key not set, a server unreachable, a provider outage), the conductor
could not be called, the run failed otherwise or was cancelled, or the verifier failed. Such a
run says nothing of the answer a system gives, so reports count it as failed, beside accuracy,
never as a wrong answer (a plan the conductor could not write is its own doing: invalid_plan
is a result)."""


def no_result(t: Trace) -> LeftOutReason | None:
    """Why run `t` has no result to count (NO_RESULT), or None when it has one."""
    reason = left_out_reason(t.status, t.reward, t.failure)
    return reason if reason in NO_RESULT else None


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    if len(values) == 1:
        return {"p50": values[0], "p90": values[0], "p99": values[0]}
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": q[49], "p90": q[89], "p99": q[98]}


def result_row(t: Trace) -> dict[str, Any]:
    verdict = t.reward.verdict if t.reward else None
    return {
        "task_id": t.task.id, "workflow_id": t.workflow_id, "run_id": t.run_id,
        "status": t.status, "answer": t.answer, "reference": t.task.reference,
        "reward": t.reward.value if t.reward else None,
        "correct": verdict.correct if verdict else None,
        "input_tokens": t.totals.usage.input_tokens,
        "output_tokens": t.totals.usage.output_tokens,
        "cost_usd": t.totals.cost_usd, "seconds": t.totals.seconds, "error": t.error,
        "agents": [s.agent for s in t.steps],
    }


def _untrusted(t: Trace) -> bool:
    return bool(t.reward and t.reward.verdict and t.reward.verdict.untrusted)


def summarize(name: str, traces: list[Trace]) -> dict[str, Any]:
    """The batch's figures. Accuracy and mean reward are over the runs with a result: runs
    that failed (`no_result`) are counted in `failed` (by reason in `failed_by_reason`) and
    verdicts the candidate could forge (assert-style code tests) in `untrusted`, neither as a
    wrong answer. Accuracy is None when no run with a reference has a result to count."""
    by_status: dict[str, int] = defaultdict(int)
    failed_by_reason: dict[str, int] = defaultdict(int)
    for t in traces:
        by_status[t.status] += 1
        reason = no_result(t)
        if reason is not None:
            failed_by_reason[reason] += 1
    with_reference = [t for t in traces if t.task.reference is not None]
    # no answer counts as wrong; a failed run and a forgeable verdict are counted apart
    ran = [t for t in with_reference if no_result(t) is None]
    judged = [t for t in ran if not _untrusted(t)]
    rewards = [t.reward.value for t in traces if no_result(t) is None
               and t.reward and t.reward.value is not None and not _untrusted(t)]
    agents: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"calls": 0, "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0,
                 "seconds": []})
    for t in traces:
        for s in t.steps:
            a = agents[s.agent]
            a["calls"] += 1
            a["input_tokens"] += s.usage.input_tokens
            a["output_tokens"] += s.usage.output_tokens
            a["cost_usd"] += s.cost_usd
            if s.status == "done":
                a["seconds"].append(s.seconds)
    return {
        "batch": name,
        "tasks": len(traces),
        "by_status": dict(by_status),
        "accuracy": (sum(1 for t in judged if t.reward and t.reward.verdict
                         and t.reward.verdict.correct) / len(judged)) if judged else None,
        "with_reference": len(with_reference),
        "judged": len(judged),
        "failed": sum(failed_by_reason.values()),
        "failed_by_reason": dict(failed_by_reason),
        "untrusted": len(ran) - len(judged),
        "mean_reward": statistics.fmean(rewards) if rewards else None,
        "input_tokens": sum(t.totals.usage.input_tokens for t in traces),
        "output_tokens": sum(t.totals.usage.output_tokens for t in traces),
        "cost_usd": sum(t.totals.cost_usd for t in traces),
        "run_seconds": _percentiles(sorted(t.totals.seconds for t in traces)),
        "agents": {
            k: {**{f: v for f, v in a.items() if f != "seconds"},
                "seconds": _percentiles(sorted(a["seconds"]))}
            for k, a in sorted(agents.items())
        },
    }


def summary_markdown(s: dict[str, Any]) -> str:
    def num(v: float | None, fmt: str = ".3f") -> str:
        return "—" if v is None else format(v, fmt)

    reasons = ", ".join(f"{k.replace('_', ' ')} {v}"
                        for k, v in s.get("failed_by_reason", {}).items())

    lines = [
        f"# Batch {s['batch']}", "",
        f"- tasks: {s['tasks']} ({', '.join(f'{k} {v}' for k, v in s['by_status'].items())})",
        f"- accuracy: {num(s['accuracy'])} over {s.get('judged', s['with_reference'])} of "
        f"{s['with_reference']} "
        "task(s) with a reference"
        + (f"; {s['failed']} run(s) failed ({reasons}): no result, not counted as wrong"
           if s.get("failed") else "")
        + (f"; {s['untrusted']} whose verdict is untrusted (assert-style tests the "
           "candidate could forge): not counted" if s.get("untrusted") else ""),
        f"- mean reward: {num(s['mean_reward'])}",
        f"- tokens in/out: {s['input_tokens']}/{s['output_tokens']} · cost: "
        f"${s['cost_usd']:.4f}",
        "- run seconds p50/p90/p99: " + "/".join(
            num(s["run_seconds"].get(k), ".1f") for k in ("p50", "p90", "p99")),
        "", "| agent | calls | tokens in/out | cost $ | s p50 | s p90 | s p99 |",
        "|---|---|---|---|---|---|---|",
    ]
    for agent, a in s["agents"].items():
        sec = a["seconds"]
        lines.append(
            f"| {agent} | {a['calls']} | {a['input_tokens']}/{a['output_tokens']} | "
            f"{a['cost_usd']:.4f} | {num(sec.get('p50'), '.2f')} | {num(sec.get('p90'), '.2f')} "
            f"| {num(sec.get('p99'), '.2f')} |")
    return "\n".join(lines) + "\n"


def task_markdown(t: Trace) -> str:
    reward = "—" if not t.reward or t.reward.value is None else f"{t.reward.value:g}"
    lines = [
        f"# {t.task.id}", "", f"**Question.** {t.task.question}", "",
        f"**Status:** {t.status} · **reward:** {reward} · **workflow:** `{t.workflow_id}`",
    ]
    if t.reward is not None:
        lines.append(f"\n**Scoring.** {t.reward.reason}")
    lines += ["", "## Answer", "", t.answer or f"*(none: {t.error or t.status})*", ""]
    final = t.steps[-1].citations if t.steps and t.answer is not None else []
    if final:
        lines += ["Sources:", *_sources(final), ""]
    for rnd in t.rounds:
        lines.append(f"## Round {rnd.index + 1}")
        for s in rnd.steps:
            lines += ["", f"### Step {s.index + 1} · {s.agent}", "",
                      f"*Subtask:* {s.subtask}  ", f"*Sees:* steps {sees_label(s.sees)} · "
                      f"{s.usage.input_tokens}/{s.usage.output_tokens} tokens · "
                      f"{s.seconds:.1f}s · {s.attempts} attempt(s)", ""]
            lines.append(s.output if s.status == "done" else f"**{s.status}:** {s.error}")
            if s.citations:
                lines += ["", "Sources:", *_sources(s.citations)]
        lines.append("")
    return "\n".join(lines)


def _sources(citations: list[Citation]) -> list[str]:
    def title(c: Citation) -> str:
        return (c.title or c.url).replace("[", "\\[").replace("]", "\\]")

    return [f"- [{title(c)}]({c.url})" for c in citations]


def _file_name(task_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", task_id)[:120] or "task"


def write_report(name: str, traces: list[Trace], out_dir: Path) -> dict[str, Any]:
    """Write the report into out_dir (created); returns the summary."""
    tasks_dir = out_dir / "tasks"
    tasks_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "results.jsonl").open("w") as f:
        for t in traces:
            f.write(json.dumps(result_row(t)) + "\n")
    summary = summarize(name, traces)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    (out_dir / "summary.md").write_text(summary_markdown(summary))
    for t in traces:
        (tasks_dir / f"{_file_name(t.task.id)}.md").write_text(task_markdown(t))
    return summary
