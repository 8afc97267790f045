"""Observability on the real Temporal dev server: a worker whose client serves /metrics shows the
SDK's metrics and the engine's (tokens, cost, reward, plan validity, latency and errors per
agent) for a run it did; a client with tracing on exports the workflow's and activities' spans
over OTLP/HTTP to a receiver; a client without either is left on the SDK's default runtime."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from temporalio.client import Client
from temporalio.runtime import Runtime

from conductor_engine.engine import observability
from conductor_engine.engine.contracts.names import (
    AGENT_ACTIVITY,
    PLAN_ACTIVITY,
    RECORD_ACTIVITY,
    SCORE_ACTIVITY,
)
from conductor_engine.engine.contracts.tasks import RunOptions, Task
from conductor_engine.engine.settings import Settings
from conductor_engine.runtime import telemetry
from conductor_engine.runtime.client import ConductorClient, connect_temporal
from tests.agent_server import AgentServer, Reply
from tests.conftest import free_port, make_pool, running_worker
from tests.plans import plan_json

Samples = dict[str, list[tuple[dict[str, str], float]]]


SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})? (\S+)")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(bind: str) -> Samples:
    """Every sample of the /metrics page, by series name as exposed (the names a dashboard
    queries; a parser that normalises counters to `_total` would hide what is served)."""
    text = httpx.get(f"http://{bind}/metrics", timeout=10).text
    out: Samples = {}
    for line in text.splitlines():
        found = SAMPLE.match(line)
        if found:
            name, labels, v = found.groups()
            out.setdefault(name, []).append((dict(LABEL.findall(labels or "")), float(v)))
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of a series over the samples whose labels include `labels`."""
    return sum(v for lab, v in samples.get(name, [])
               if all(lab.get(k) == want for k, want in labels.items()))


async def test_a_worker_with_metrics_bind_serves_the_sdks_and_the_engines_metrics(
    agent_server: AgentServer, settings: Settings,
) -> None:
    bind = f"127.0.0.1:{free_port()}"
    s = settings.model_copy(update={"metrics_bind": bind})
    client = await connect_temporal(s, start_embedded=False)
    again = await connect_temporal(s, start_embedded=False)
    assert client.service_client.config.runtime is again.service_client.config.runtime, \
        "one runtime (one listener) per bind address"
    # the first plan is malformed, the second names two agents; claude's first attempt is a 503
    agent_server.script("conductor", [
        Reply.ok("no plan", input_tokens=100, output_tokens=2),
        Reply.ok(plan_json(("gpt", "Work out 6*7.", []), ("claude", "Check it.", [0])),
                 input_tokens=120, output_tokens=30)])
    agent_server.script("gpt", [Reply.ok("42", input_tokens=40, output_tokens=5)])
    agent_server.script("claude", [Reply.error(503, "overloaded"),
                                   Reply.ok("42", input_tokens=60, output_tokens=3)])
    task = Task(question="What is 6*7?", reference="42", verifier="exact",
                options=RunOptions(max_plan_attempts=2))
    async with running_worker(client, s, make_pool(agent_server)):
        res = await ConductorClient(client, s).run(task)
    assert res.status == "completed" and res.reward is not None and res.reward.value

    m = scrape(bind)
    # the SDK's own: workflow completions and activity latencies, by type
    assert value(m, "temporal_workflow_completed", workflow_type="ConductWorkflow") >= 1
    assert value(m, "temporal_activity_execution_latency_count", activity_type="call_agent") >= 2
    assert "temporal_activity_schedule_to_start_latency_count" in m
    # the engine's, labelled by agent
    step = {"kind": "step"}
    assert value(m, "conductor_tokens_in", agent="gpt", provider="openai", **step) == 40
    assert value(m, "conductor_tokens_out", agent="gpt", provider="openai", **step) == 5
    assert value(m, "conductor_tokens_in", agent="claude", provider="anthropic", **step) == 60
    assert value(m, "conductor_tokens_in", agent="conductor", kind="plan") == 220
    assert value(m, "conductor_tokens_out", agent="conductor", kind="plan") == 32
    gpt_cost = value(m, "conductor_cost_usd_sum", agent="gpt")
    assert gpt_cost == pytest.approx((40 * 1.0 + 5 * 2.0) / 1e6)  # the test pool's prices
    assert value(m, "conductor_cost_usd_count", agent="gpt") == 1
    assert value(m, "conductor_plans", agent="conductor", outcome="invalid") == 1
    assert value(m, "conductor_plans", agent="conductor", outcome="valid") == 1
    assert value(m, "conductor_step_errors", agent="claude", provider="anthropic", kind="step",
                 error="AgentUnavailable") == 1
    assert value(m, "conductor_step_errors", agent="gpt") == 0
    # two attempts of claude (the 503 and the answer), one of gpt, two plans
    assert value(m, "conductor_step_latency_seconds_count", agent="claude") == 2
    assert value(m, "conductor_step_latency_seconds_count", agent="conductor", kind="plan") == 2
    latency = value(m, "conductor_step_latency_seconds_sum", agent="gpt")
    assert 0 < latency < 60, latency
    runs = {"conductor": "conductor", "policy_version": "base"}
    assert value(m, "conductor_runs", status="completed", **runs) == 1
    assert value(m, "conductor_reward_count", verifier="exact", **runs) == 1
    assert value(m, "conductor_reward_sum", **runs) == pytest.approx(res.reward.value)
    # the histogram's buckets are the engine's (0.1 steps), not the SDK's milliseconds
    buckets = {lab["le"] for lab, _ in m["conductor_reward_bucket"]}
    assert {"0.5", "1", "+Inf"} <= buckets
    # every engine metric the module lists (this run met each) is served under its names
    for metric in observability.METRICS:
        assert observability.exported_names(metric) <= set(m), metric.name
    # and so is every SDK metric the dashboard queries (claude's 503 failed one activity)
    for metric in observability.SDK_METRICS:
        assert observability.exported_names(metric) <= set(m), metric.name


async def test_without_metrics_bind_a_client_stays_on_the_default_runtime(
    client: Client, settings: Settings,
) -> None:
    plain = await connect_temporal(settings, start_embedded=False)
    assert plain.service_client.config.runtime is None or \
        plain.service_client.config.runtime is Runtime.default()
    assert client.service_client.config.runtime in (None, Runtime.default()), \
        "the tests' shared client is untouched"
    assert telemetry.tracing_interceptors(settings) == []


def test_a_taken_metrics_port_is_one_clear_error(settings: Settings) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        bind = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(telemetry.TelemetryError, match=f"metrics_bind {bind}: cannot"):
            telemetry.metrics_runtime(settings.model_copy(update={"metrics_bind": bind}))


class _Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP trace receiver (what a collector listens with on :4318): keeps each body."""

    bodies: list[bytes]

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/v1/traces":
            type(self).bodies.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def otlp_receiver() -> Iterator[tuple[str, list[bytes]]]:
    handler = type("Receiver", (_Receiver,), {"bodies": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler.bodies
    server.shutdown()


async def test_with_otel_endpoint_a_run_exports_workflow_and_activity_spans(
    agent_server: AgentServer, settings: Settings, otlp_receiver: tuple[str, list[bytes]],
) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    endpoint, bodies = otlp_receiver
    s = settings.model_copy(update={"otel_endpoint": endpoint})
    client = await connect_temporal(s, start_embedded=False)
    agent_server.script("conductor", [plan_json(("gpt", "Work out 6*7.", []))])
    agent_server.script("gpt", ["42"])
    try:
        async with running_worker(client, s, make_pool(agent_server)):
            res = await ConductorClient(client, s).run(
                Task(question="What is 6*7?", reference="42", verifier="exact"))
    finally:
        # every span exported, then the provider stopped: nothing retries against the
        # receiver once this test has closed it
        telemetry.shutdown_tracing()

    spans = []
    for body in bodies:
        req = ExportTraceServiceRequest.FromString(body)
        for rs in req.resource_spans:
            service = {a.key: a.value.string_value for a in rs.resource.attributes}
            assert service["service.name"] == "conductor-engine"
            spans += [sp for ss in rs.scope_spans for sp in ss.spans]
    names = {sp.name for sp in spans}
    assert "StartWorkflow:ConductWorkflow" in names, names
    assert "RunWorkflow:ConductWorkflow" in names, names
    for act in (PLAN_ACTIVITY, AGENT_ACTIVITY, SCORE_ACTIVITY, RECORD_ACTIVITY):
        assert f"StartActivity:{act}" in names and f"RunActivity:{act}" in names, names
    # one trace: every span of the run shares the client's StartWorkflow trace id
    [start] = [sp for sp in spans if sp.name == "StartWorkflow:ConductWorkflow"
               and any(a.value.string_value == res.workflow_id for a in sp.attributes)]
    run_spans = [sp for sp in spans if sp.trace_id == start.trace_id]
    assert {"RunWorkflow:ConductWorkflow", "RunActivity:call_agent"} <= {
        sp.name for sp in run_spans}
