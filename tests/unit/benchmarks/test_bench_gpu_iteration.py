"""The whole-iteration GPU benchmark's code path (tests/benchmarks/bench_gpu_iteration.py) on its
--small shape on the CPU: two iterations through the provider, the sim agents, the trainer and
the publish and pick-up of a version, so the one-command device check cannot rot unnoticed."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,  # about two minutes on two busy cores: 16 plans generated one at a time
    pytest.mark.skipif(
        any(importlib.util.find_spec(m) is None
            for m in ("torch", "transformers", "peft", "xgrammar")),
        reason="the local and train extras are not installed"),
]


def test_small_iterations_sample_the_published_version_and_report_every_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.benchmarks import bench_gpu_iteration as bench

    monkeypatch.setenv("CONDUCTOR_LOCAL_DEVICE", "cpu")
    out = tmp_path / "iteration.json"
    code = asyncio.run(bench.main([
        "--small", "--groups", "2", "--group-size", "4", "--max-tokens", "96",
        "--cache-dir", str(tmp_path / "models"), "--json", str(out)]))
    assert code == 0
    r = json.loads(out.read_text())
    first, second = r["iterations"]
    assert first["version"] == "base"
    assert second["version"] == str(tmp_path / "models" / "iteration-versions-small" / "v1")
    assert (Path(second["version"]) / "adapter_config.json").is_file()
    for row in (first, second):
        assert len(row["group_s"]) == 2 and row["plan_tokens"] > 0
        assert row["iteration_s"] >= row["generate_s"] + row["update_s"] + row["publish_s"]
    assert r["ratio_to_bare"] == pytest.approx(r["bare_group_s"] / r["ours_group_s"])
    assert r["ratio_to_bound"] == pytest.approx(r["decode_bound_s"] / r["ours_group_s"])
    assert r["bandwidth_bytes_per_s"] > 0 and r["provider_resident_bytes"] > 0
    assert "bare generate" in bench.report(r)
