"""The Grafana dashboard queries only metrics the engine or the Temporal SDK exports, and shows
every engine metric; tracing configured without the otel extra is one clear line."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import pytest

from conductor_engine.engine.observability import METRICS, SDK_METRICS, exported_names
from conductor_engine.engine.settings import Settings
from conductor_engine.runtime import telemetry
from tests.paths import ROOT

DASHBOARD = ROOT / "infra" / "grafana" / "conductor-dashboard.json"
NAME = re.compile(r"\b((?:conductor|temporal)_[a-z0-9_]+)\b")


def _exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_the_dashboard_queries_only_exported_metrics_and_shows_every_engine_metric() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = _exprs(dashboard)
    assert len(dashboard["panels"]) >= 8 and exprs
    queried = {name for e in exprs for name in NAME.findall(e)}
    exported = set().union(*(exported_names(m) for m in (*METRICS, *SDK_METRICS)))
    assert queried <= exported, f"not exported: {sorted(queried - exported)}"
    for metric in METRICS:
        assert queried & exported_names(metric), f"no panel shows {metric.name}"
    # every panel reads the dashboard's Prometheus data source variable
    assert {p["datasource"]["uid"] for p in dashboard["panels"]} == {"${datasource}"}
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource"]


def test_labels_the_dashboard_groups_by_are_the_metrics_own() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    by_name = {n: m for m in (*METRICS, *SDK_METRICS) for n in exported_names(m)}
    for expr in _exprs(dashboard):
        grouped = {lab.strip() for found in re.findall(r"by \(([^)]*)\)", expr)
                   for lab in found.split(",")} - {"le"}
        labels = set().union(*(by_name[n].labels for n in NAME.findall(expr)))
        assert grouped <= labels, (expr, grouped - labels)


def test_tracing_configured_without_the_otel_extra_is_one_clear_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "temporalio.contrib.opentelemetry", None)
    settings = Settings(otel_endpoint="http://127.0.0.1:4318")
    with pytest.raises(telemetry.TelemetryError,
                       match=r"pip install 'conductor-engine\[otel\]'"):
        telemetry.tracing_interceptors(settings)


def test_the_standard_otlp_variable_turns_tracing_on(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not telemetry.tracing_enabled(Settings())
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    assert telemetry.tracing_enabled(Settings())


@pytest.mark.parametrize("bind", ["nonsense", "127.0.0.1:70000", ":9000", "host:port"])
def test_a_bad_metrics_bind_is_one_line_saying_the_form(
    bind: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from conductor_engine.engine.settings import SettingsError

    monkeypatch.setenv("CONDUCTOR_METRICS_BIND", bind)
    with pytest.raises(SettingsError, match=r"^environment variable CONDUCTOR_METRICS_BIND: .*"
                       r"expected host:port, e.g. 127.0.0.1:9000"):
        Settings()
    monkeypatch.setenv("CONDUCTOR_METRICS_BIND", "[::1]:9000")
    assert Settings().metrics_bind == "[::1]:9000"
