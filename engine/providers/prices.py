"""What an agent's tokens cost: the pool file's prices where it gives them, else the maintained
price table of the `genai-prices` package, so a pool file need not copy (and let go stale) every
provider's price list.

Each price has a source, which `conductor pool show` prints: `pool file` (the agent's
`price_input_per_mtok` / `price_output_per_mtok`, each an override of its own), `genai-prices`
(the table, matched by provider and model), `local` (local and sim agents: they run here, free
per token unless the pool file prices them) or `unknown` (not in the table: counted as 0, and
shown so, so a missing price is never mistaken for a free model).

A call's cost from the table uses the table's own calculation for that call's usage, so tiered
prices (Gemini's above 200k input tokens, say) apply as the provider bills them.
"""

from __future__ import annotations

import functools
from typing import Any, Literal, Protocol

from pydantic import BaseModel

PriceSource = Literal["pool file", "genai-prices", "local", "unknown"]

# Our provider names as the price table names them. An OpenAI-compatible server is looked up by
# its base URL only: a self-hosted vLLM serving an open model must not be billed as some hosted
# provider's copy of that model.
_TABLE_PROVIDERS = {"openai": "openai", "anthropic": "anthropic", "google": "google"}


class AgentSpec(Protocol):
    """What pricing reads of an agent (engine/contracts/agents.py's AgentSpec)."""

    @property
    def provider(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def base_url(self) -> str | None: ...
    @property
    def price_input_per_mtok(self) -> float | None: ...
    @property
    def price_output_per_mtok(self) -> float | None: ...


class Price(BaseModel):
    """One price in USD per million tokens (None: unknown), and where it came from."""

    per_mtok: float | None
    source: PriceSource


class AgentPrices(BaseModel):
    """An agent's input and output prices as `pool show --json` lists them; `tiered` when the
    table's price rises past some prompt size (the listed price is the lowest tier)."""

    input: Price
    output: Price
    tiered: bool = False


def _lookup_key(spec: AgentSpec) -> tuple[str, str | None, str | None] | None:
    """(model, provider id, provider API URL) to look the agent up by; None: not in a table."""
    if spec.provider in ("local", "sim"):
        return None
    if spec.provider in _TABLE_PROVIDERS:
        return spec.model, _TABLE_PROVIDERS[spec.provider], None
    if spec.base_url:
        return spec.model, None, spec.base_url
    return None


def _calculate(key: tuple[str, str | None, str | None], input_tokens: int,
               output_tokens: int) -> Any | None:
    """The table's PriceCalculation for this usage, None when the model is not in it."""
    from genai_prices import Usage, calc_price  # imported on first use: 0.2 s

    model, provider_id, api_url = key
    usage = Usage(input_tokens=input_tokens, output_tokens=output_tokens)
    try:
        if api_url is not None:
            return calc_price(usage, model, provider_api_url=api_url)
        return calc_price(usage, model, provider_id=provider_id)
    except LookupError:
        return None


@functools.lru_cache(maxsize=256)
def _listed(key: tuple[str, str | None, str | None]) -> Any | None:
    """The table's entry for a model (the calculation of a one-token call), cached."""
    return _calculate(key, 1, 1)


def _per_mtok(value: Any) -> tuple[float, bool]:
    """A table price (a number, or tiered prices) as its base USD per Mtok, and whether tiered."""
    base = getattr(value, "base", value)
    return (0.0 if base is None else float(base)), hasattr(value, "tiers")


def agent_prices(spec: AgentSpec) -> AgentPrices:
    """The agent's prices per million tokens and their sources."""
    key = _lookup_key(spec)
    calc = _listed(key) if key is not None else None
    fallback: PriceSource = "local" if key is None and spec.provider in ("local", "sim") \
        else "unknown"
    tiered = False
    prices: list[Price] = []
    for given, field in ((spec.price_input_per_mtok, "input_mtok"),
                         (spec.price_output_per_mtok, "output_mtok")):
        if given is not None:
            prices.append(Price(per_mtok=given, source="pool file"))
        elif calc is not None:
            value, is_tiered = _per_mtok(getattr(calc.model_price, field, None))
            tiered = tiered or is_tiered
            prices.append(Price(per_mtok=value, source="genai-prices"))
        else:
            prices.append(Price(per_mtok=0.0 if fallback == "local" else None, source=fallback))
    return AgentPrices(input=prices[0], output=prices[1], tiered=tiered)


def call_cost(spec: AgentSpec, input_tokens: int, output_tokens: int) -> float:
    """USD for one call with this usage: a pool file's price times the tokens where given, the
    table's calculation for the rest, 0 for what has no price."""
    key = _lookup_key(spec)
    given_in, given_out = spec.price_input_per_mtok, spec.price_output_per_mtok
    calc = None
    if key is not None and (given_in is None or given_out is None):
        calc = _calculate(key, input_tokens, output_tokens)
    cost_in = (given_in * input_tokens / 1_000_000 if given_in is not None
               else float(calc.input_price) if calc is not None else 0.0)
    cost_out = (given_out * output_tokens / 1_000_000 if given_out is not None
                else float(calc.output_price) if calc is not None else 0.0)
    return cost_in + cost_out
