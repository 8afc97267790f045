"""Which agents' budgets are likely to truncate (engine/providers/budget.py), `pool show`'s
warning, the paper's pool, and the reasoning effort reaching the OpenAI wire format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conductor_engine.engine.contracts.agent_calls import Message
from conductor_engine.engine.providers.base import CompletionRequest
from conductor_engine.engine.providers.budget import (
    MIN_REASONING_TOKENS,
    reasons,
    truncation_risk,
)
from conductor_engine.engine.providers.openai_provider import _arguments
from conductor_engine.engine.providers.pool import AgentSpec, Pool, PoolError
from conductor_engine.runtime.cli import app
from tests.paths import ROOT

PAPER_POOL = ROOT / "examples" / "paper" / "pool.toml"


def agent(model: str, provider: str = "openai", **fields: object) -> AgentSpec:
    return AgentSpec.model_validate({"id": "a", "provider": provider, "model": model,
                                     **fields})


@pytest.mark.parametrize(("model", "provider", "thinks"), [
    ("gpt-5", "openai", True), ("o3-mini", "openai", True), ("gpt-4o", "openai", False),
    ("gemini-2.5-pro", "google", True), ("claude-sonnet-4-20250514", "anthropic", False),
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "openai-compatible", True),
    ("Qwen/Qwen3-32B", "openai-compatible", True),
    ("Qwen/Qwen3-235B-A22B-Instruct-2507", "openai-compatible", False),
    ("google/gemma-3-27b-it", "openai-compatible", False),
])
def test_reasoning_models_are_known_by_name(model: str, provider: str, thinks: bool) -> None:
    assert reasons(agent(model, provider)) is thinks


def test_a_reasoning_model_under_the_budget_or_timeout_is_flagged_and_others_are_not() -> None:
    assert "max_tokens 4,096 < 16,384" in (truncation_risk(
        agent("gpt-5", params={"max_tokens": 4096})) or "")
    enough = {"max_tokens": MIN_REASONING_TOKENS}
    assert truncation_risk(agent("gpt-5", params=enough, timeout_s=900)) is None
    assert "timeout_s 120 < 600" in (truncation_risk(agent("gpt-5", params=enough)) or "")
    assert truncation_risk(agent("gpt-4o", params={"max_tokens": 512})) is None
    effort = agent("my-model", "openai-compatible", base_url="http://x/v1",
                   params={"reasoning_effort": "high", "max_tokens": 1024})
    assert truncation_risk(effort) is not None, "a set effort makes any model a reasoner"


def test_pool_show_warns_about_a_short_gpt_5_and_not_about_the_shipped_pools(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    short = tmp_path / "short.toml"
    short.write_text('[conductor]\nid = "c"\nprovider = "local"\nmodel = "smollm2-135m-instruct"\n'
                     '[[agents]]\nid = "gpt-5"\nprovider = "openai"\nmodel = "gpt-5"\n'
                     'params = { max_tokens = 4096 }\n')
    runner = CliRunner()
    flagged = runner.invoke(app, ["pool", "show", "--pool", str(short)], env={"COLUMNS": "400"})
    assert flagged.exit_code == 0, flagged.output
    assert ("warning: gpt-5: likely to truncate: max_tokens 4,096 < 16,384: a reasoning "
            "model's hidden reasoning counts against it") in flagged.stderr
    default = runner.invoke(app, ["pool", "show"], env={"COLUMNS": "400"})
    assert default.exit_code == 0, default.output
    assert "warning" not in default.stderr
    paper = runner.invoke(app, ["pool", "show", "--pool", str(PAPER_POOL), "--json"],
                          env={"COLUMNS": "400"})
    assert paper.exit_code == 0, paper.output
    listed = {a["id"]: a for a in json.loads(paper.stdout)}
    assert set(listed) == {"conductor", "gpt-5", "claude-sonnet-4", "gemini-2.5-pro",
                           "deepseek-r1-distill-qwen-32b", "gemma-3-27b", "qwen3-32b"}
    assert all(a["truncation"] is None for a in listed.values())
    assert "warning" not in paper.stderr


def test_the_paper_pool_gives_its_reasoners_room_and_its_open_workers_a_base_url() -> None:
    pool = Pool.load(PAPER_POOL)
    for a in pool.agents:
        if reasons(a):
            assert a.params.max_tokens >= 32768 and a.timeout_s >= 1200, a.id
        if a.provider == "openai-compatible":
            assert a.base_url and a.is_configured({}), a.id
    assert pool.get("gpt-5").params.reasoning_effort == "medium"


def test_reasoning_effort_reaches_the_openai_request_and_is_refused_where_not_taken(
        tmp_path: Path) -> None:
    request = CompletionRequest(messages=[Message(role="user", content="hi")])
    spec = agent("gpt-5", params={"reasoning_effort": "high"})
    assert _arguments(spec, request)["reasoning_effort"] == "high"
    assert "reasoning_effort" not in _arguments(agent("gpt-5"), request)
    bad = tmp_path / "pool.toml"
    bad.write_text(PAPER_POOL.read_text().replace(
        "params = { max_tokens = 16384 }",
        'params = { max_tokens = 16384, reasoning_effort = "low" }'))
    with pytest.raises(PoolError, match=r"reasoning_effort is for providers openai and "
                                        r"openai-compatible, not anthropic"):
        Pool.load(bad)
