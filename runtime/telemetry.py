"""Metrics and traces for a process's Temporal client and workers, with the ecosystem's tools.

Metrics: with `metrics_bind` set, the client is connected on a Temporal SDK `Runtime` whose
Prometheus exporter serves `http://BIND/metrics`: the SDK's own metrics (`temporal_*`: workflow
completions, activity latencies, schedule-to-start, poller state) and the engine's
(engine/observability.py), which activities record through the same meter. A Runtime owns a
thread pool and a listening socket, so there is one per bind address per process, made on first
use and reused by every client after it. Without `metrics_bind` the SDK's default runtime is
used, as before, and nothing listens.

Traces: with `otel_endpoint` set (or the standard OTEL_EXPORTER_OTLP_ENDPOINT /
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), the client carries the SDK's OpenTelemetry
`TracingInterceptor`, which a worker built on that client inherits: every workflow start,
workflow run, activity start and activity run becomes a span, exported over OTLP (HTTP/protobuf,
or gRPC when OTEL_EXPORTER_OTLP_PROTOCOL says so) to a collector, Jaeger or Tempo. It needs the
`otel` extra.
"""

from __future__ import annotations

import os
from typing import Any

from temporalio.client import Interceptor
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from conductor_engine.engine.observability import bucket_overrides
from conductor_engine.engine.settings import Settings

OTEL_INSTALL = "pip install 'conductor-engine[otel]'"
OTEL_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

_runtimes: dict[str, Runtime] = {}
_tracer_providers: dict[str, Any] = {}


class TelemetryError(RuntimeError):
    """Metrics or tracing cannot start as configured; the message says what to do."""


def metrics_runtime(settings: Settings) -> Runtime | None:
    """The runtime serving /metrics on `settings.metrics_bind` (None: metrics off, the SDK's
    default runtime). Made once per bind address in this process."""
    bind = settings.metrics_bind
    if not bind:
        return None
    runtime = _runtimes.get(bind)
    if runtime is None:
        try:
            runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(
                bind_address=bind, histogram_bucket_overrides=bucket_overrides())))
        except Exception as e:  # the bridge raises a plain exception for a taken port
            raise TelemetryError(
                f"metrics_bind {bind}: cannot serve /metrics there ({e}); pick a free "
                "host:port (CONDUCTOR_METRICS_BIND) or unset it") from e
        _runtimes[bind] = runtime
    return runtime


def tracing_enabled(settings: Settings) -> bool:
    return bool(settings.otel_endpoint) or any(os.environ.get(v) for v in OTEL_ENV)


def tracing_interceptors(settings: Settings) -> list[Interceptor]:
    """[TracingInterceptor] when tracing is configured, else []. TelemetryError, naming the
    extra to install, when it is configured but OpenTelemetry is not installed."""
    if not tracing_enabled(settings):
        return []
    try:
        from temporalio.contrib.opentelemetry import TracingInterceptor
    except ImportError as e:
        raise TelemetryError(
            f"tracing is configured (otel_endpoint or OTEL_EXPORTER_OTLP_ENDPOINT) but "
            f"OpenTelemetry is not installed: {OTEL_INSTALL}, or unset it ({e.name} missing)"
        ) from e
    return [TracingInterceptor(tracer_provider(settings).get_tracer("conductor_engine"))]


def tracer_provider(settings: Settings) -> Any:
    """The process's tracer provider exporting over OTLP to the configured endpoint, made once
    per endpoint; it becomes OpenTelemetry's global provider unless one is set already (then
    code of the user's own can add spans under the engine's)."""
    key = settings.otel_endpoint or ""
    provider = _tracer_providers.get(key)
    if provider is not None:
        return provider
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as e:
        raise TelemetryError(f"tracing needs the OpenTelemetry SDK: {OTEL_INSTALL}") from e
    # Resource.create reads OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES over this default
    provider = TracerProvider(resource=Resource.create(
        {"service.name": os.environ.get("OTEL_SERVICE_NAME", "conductor-engine")}))
    provider.add_span_processor(BatchSpanProcessor(_exporter(settings.otel_endpoint)))
    from opentelemetry.trace import ProxyTracerProvider

    if isinstance(trace.get_tracer_provider(), ProxyTracerProvider):  # none set yet
        trace.set_tracer_provider(provider)
    _tracer_providers[key] = provider
    return provider


def _exporter(endpoint: str | None) -> Any:
    """The OTLP span exporter: HTTP/protobuf to ENDPOINT/v1/traces (the collector's :4318), or
    gRPC when OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL is `grpc` (the collector's :4317). With no
    endpoint of ours, the exporter reads the OTEL_* variables itself."""
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )

            return GrpcExporter(endpoint=endpoint) if endpoint else GrpcExporter()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as e:
        raise TelemetryError(f"tracing needs the OTLP exporter: {OTEL_INSTALL}") from e
    if endpoint:
        return OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")
    return OTLPSpanExporter()


def flush_traces() -> None:
    """Export the spans still buffered (a short-lived command ends before the batch timer)."""
    for provider in _tracer_providers.values():
        provider.force_flush()


def shutdown_tracing() -> None:
    """Flush and stop every tracer provider this process made, so none keeps exporting (and
    retrying) to an endpoint that has gone away; the next tracing client makes a new one."""
    for provider in _tracer_providers.values():
        provider.shutdown()
    _tracer_providers.clear()
