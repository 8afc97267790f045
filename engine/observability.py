"""The engine's own metrics: what they are called, what they mean, and one call per event.

They are recorded through the Temporal SDK's metric meter (`activity.metric_meter()`), so they
come out of the same Prometheus endpoint as the SDK's own metrics (`temporal_*`) when a process
has `metrics_bind` set (runtime/telemetry.py), and cost nothing when it has not (the
meter is then a no-op). Activities call the `record_*` functions here and stay thin.

Counters are integers in the SDK, so money is a float histogram: `conductor_cost_usd_sum` is
the dollars spent, `_count` the calls. Every metric also carries the SDK's activity labels
(namespace, task_queue, activity_type).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from temporalio.common import MetricMeter

MetricType = Literal["counter", "histogram", "gauge"]
Role = Literal["plan", "step"]
"""`kind` label: `plan` for the conductor writing a plan, `step` for an agent doing a step."""


@dataclass(frozen=True)
class Metric:
    name: str
    type: MetricType
    labels: tuple[str, ...]
    description: str
    unit: str = ""
    buckets: tuple[float, ...] = ()  # histograms: bucket upper bounds, in `unit`


CALL_LABELS = ("agent", "provider", "kind")

TOKENS_IN = Metric("conductor_tokens_in", "counter", CALL_LABELS,
                   "prompt tokens sent to a model, per agent (the conductor's plans: kind=plan)")
TOKENS_OUT = Metric("conductor_tokens_out", "counter", CALL_LABELS,
                    "completion tokens a model wrote, per agent")
COST = Metric("conductor_cost_usd", "histogram", CALL_LABELS,
              "US dollars per model call at the pool's prices; _sum is the total spent",
              unit="USD", buckets=(0.0001, 0.001, 0.01, 0.1, 1.0, 10.0))
STEP_LATENCY = Metric("conductor_step_latency_seconds", "histogram", CALL_LABELS,
                      "seconds one model call took (a plan, or one step's attempt)",
                      unit="s", buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
                                         600))
STEP_ERRORS = Metric("conductor_step_errors", "counter", (*CALL_LABELS, "error"),
                     "model calls that failed, by error kind (AgentRateLimited, AgentTimeout, "
                     "...: engine/providers/errors.py); Temporal retries the retryable ones")
PLANS = Metric("conductor_plans", "counter", ("agent", "provider", "outcome"),
               "plans the conductor wrote: outcome=valid (parsed and validated) or invalid")
REWARD = Metric("conductor_reward", "histogram", ("conductor", "policy_version", "verifier"),
                "the reward of each finished user run (depth 0), by policy version",
                buckets=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0))
RUNS = Metric("conductor_runs", "counter", ("conductor", "policy_version", "status"),
              "finished user runs (depth 0) by status (completed, invalid_plan, failed, ...)")

METRICS: tuple[Metric, ...] = (TOKENS_IN, TOKENS_OUT, COST, STEP_LATENCY, STEP_ERRORS, PLANS,
                               REWARD, RUNS)


# The Temporal SDK's own metrics (its Rust core's, prefixed `temporal_`) that the dashboard
# (infra/grafana/conductor-dashboard.json) and docs/how-to/metrics.md use; durations in
# milliseconds, as the SDK exports them by default. tests/integration/test_observability.py
# checks they are served.
SDK_METRICS: tuple[Metric, ...] = (
    Metric("temporal_workflow_completed", "counter", ("workflow_type", "task_queue"),
           "workflows that completed"),
    Metric("temporal_workflow_endtoend_latency", "histogram", ("workflow_type", "task_queue"),
           "workflow run time, start to close", unit="ms"),
    Metric("temporal_activity_execution_latency", "histogram", ("activity_type", "task_queue"),
           "activity attempt time", unit="ms"),
    Metric("temporal_activity_schedule_to_start_latency", "histogram",
           ("activity_type", "task_queue"),
           "time an activity waited for a worker: rising means too few workers", unit="ms"),
    Metric("temporal_activity_execution_failed", "counter", ("activity_type", "task_queue"),
           "activity attempts that failed (retried or not)"),
    Metric("temporal_worker_task_slots_available", "gauge", ("worker_type", "task_queue"),
           "free slots of the worker: zero means it is saturated"),
)


def exported_names(metric: Metric) -> set[str]:
    """The series names Prometheus shows for a metric (a histogram's three)."""
    if metric.type == "histogram":
        return {f"{metric.name}_{s}" for s in ("bucket", "sum", "count")}
    return {metric.name}


def bucket_overrides() -> dict[str, list[float]]:
    """The engine histograms' buckets, for the runtime's Prometheus exporter (the SDK's default
    buckets are for milliseconds)."""
    return {m.name: list(m.buckets) for m in METRICS if m.type == "histogram" and m.buckets}


def _counter(meter: MetricMeter, m: Metric, value: int, labels: dict[str, str]) -> None:
    if value > 0:
        meter.create_counter(m.name, m.description, m.unit or None).add(value, labels)


def _histogram(meter: MetricMeter, m: Metric, value: float, labels: dict[str, str]) -> None:
    meter.create_histogram_float(m.name, m.description, m.unit or None).record(value, labels)


def record_call(meter: MetricMeter, *, agent: str, provider: str, kind: Role,
                input_tokens: int, output_tokens: int, cost_usd: float, seconds: float) -> None:
    """One model call that answered: tokens, cost and latency, labelled by agent."""
    labels = {"agent": agent, "provider": provider, "kind": kind}
    _counter(meter, TOKENS_IN, input_tokens, labels)
    _counter(meter, TOKENS_OUT, output_tokens, labels)
    _histogram(meter, COST, max(cost_usd, 0.0), labels)
    _histogram(meter, STEP_LATENCY, max(seconds, 0.0), labels)


def record_error(meter: MetricMeter, *, agent: str, provider: str, kind: Role, error: str,
                 seconds: float) -> None:
    """One model call that failed (its latency too: slow failures are what one looks for)."""
    labels = {"agent": agent, "provider": provider, "kind": kind}
    _counter(meter, STEP_ERRORS, 1, {**labels, "error": error or "unknown"})
    _histogram(meter, STEP_LATENCY, max(seconds, 0.0), labels)


def record_plan(meter: MetricMeter, *, agent: str, provider: str, valid: bool) -> None:
    _counter(meter, PLANS, 1, {"agent": agent, "provider": provider,
                               "outcome": "valid" if valid else "invalid"})


def record_run(meter: MetricMeter, *, conductor: str, policy_version: str, status: str,
               reward: float | None, verifier: str | None) -> None:
    """A finished user run: its status, and its reward where it has one."""
    labels = {"conductor": conductor, "policy_version": policy_version}
    _counter(meter, RUNS, 1, {**labels, "status": status})
    if reward is not None:
        _histogram(meter, REWARD, reward, {**labels, "verifier": verifier or "none"})
