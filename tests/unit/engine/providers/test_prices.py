"""Agents' prices: the genai-prices table by default, the pool file's prices as overrides (each
on its own), local and sim agents free unless priced, and an unknown model shown as unknown."""

from __future__ import annotations

from pathlib import Path

import pytest

from conductor_engine.engine.providers.pool import AgentSpec, Pool
from conductor_engine.engine.providers.prices import agent_prices, call_cost


def test_the_shipped_pool_is_priced_from_the_table() -> None:
    pool = Pool.load()
    for agent_id in ("gpt-5", "claude-sonnet-4", "gemini-2.5-pro"):
        spec = pool.get(agent_id)
        assert spec.price_input_per_mtok is None  # the pool file leaves prices to the table
        prices = agent_prices(spec)
        assert prices.input.source == prices.output.source == "genai-prices"
        assert prices.input.per_mtok and prices.input.per_mtok > 0
        assert prices.output.per_mtok and prices.output.per_mtok > prices.input.per_mtok
        expected = (1000 * prices.input.per_mtok + 100 * prices.output.per_mtok) / 1e6
        assert call_cost(spec, 1000, 100) == pytest.approx(expected)
    for local in (pool.conductor, pool.get("smollm2")):
        prices = agent_prices(local)
        assert (prices.input.per_mtok, prices.input.source) == (0.0, "local")
        assert call_cost(local, 10_000, 10_000) == 0.0


def test_a_pool_file_price_overrides_the_table(tmp_path: Path) -> None:
    path = tmp_path / "pool.toml"
    path.write_text('[conductor]\nid = "c"\nprovider = "local"\nmodel = "smollm2-135m-instruct"\n'
                    '[[agents]]\nid = "g"\nprovider = "openai"\nmodel = "gpt-5"\n'
                    'api_key_env = "OPENAI_API_KEY"\nprice_input_per_mtok = 7.0\n'
                    '[[agents]]\nid = "s"\nprovider = "sim"\nmodel = "sim"\n'
                    'price_input_per_mtok = 1.0\nprice_output_per_mtok = 4.0\n')
    pool = Pool.load(path)
    table = agent_prices(AgentSpec(id="t", provider="openai", model="gpt-5"))
    prices = agent_prices(pool.get("g"))
    assert (prices.input.per_mtok, prices.input.source) == (7.0, "pool file")
    assert prices.output == table.output  # only the input price was given
    assert call_cost(pool.get("g"), 1_000_000, 0) == pytest.approx(7.0)
    assert call_cost(pool.get("g"), 0, 1_000_000) == pytest.approx(table.output.per_mtok)
    sim = agent_prices(pool.get("s"))
    assert (sim.input.source, sim.output.per_mtok) == ("pool file", 4.0)
    assert call_cost(pool.get("s"), 500, 300) == pytest.approx((500 * 1.0 + 300 * 4.0) / 1e6)


def test_a_model_the_table_lacks_is_unknown_and_costs_nothing() -> None:
    spec = AgentSpec(id="x", provider="openai-compatible", model="Qwen/Qwen2.5-7B-Instruct",
                     base_url="http://localhost:8000/v1")
    prices = agent_prices(spec)
    assert (prices.input.per_mtok, prices.input.source) == (None, "unknown")
    assert call_cost(spec, 1000, 1000) == 0.0
    made_up = AgentSpec(id="y", provider="anthropic", model="claude-no-such-model")
    assert agent_prices(made_up).output.source == "unknown"


def test_tiered_table_prices_apply_as_billed() -> None:
    """Gemini 2.5 Pro costs more per token past 200k prompt tokens: the listing shows the
    base price and says it is tiered; a long call's cost uses the higher tier."""
    spec = AgentSpec(id="g", provider="google", model="gemini-2.5-pro")
    prices = agent_prices(spec)
    assert prices.tiered
    base = prices.input.per_mtok
    assert base is not None
    assert call_cost(spec, 100_000, 0) == pytest.approx(0.1 * base)
    assert call_cost(spec, 300_000, 0) > 0.3 * base
