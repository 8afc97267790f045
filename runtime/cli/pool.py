"""`conductor pool show`: the agent pool, each agent's provider, key, prices and capabilities.
(`plan check` is in cli/plan.py.)"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from pydantic import BaseModel, Field

from conductor_engine.engine.providers.budget import truncation_risk
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.providers.prices import AgentPrices, Price, agent_prices
from conductor_engine.engine.providers.registry import capabilities
from conductor_engine.runtime.cli.app import (
    PoolOpt,
    err,
    load_pool,
    load_settings,
    out,
    pool_app,
)
from conductor_engine.runtime.cli.render import fitted_table


class AgentListing(BaseModel):
    """One agent as `pool show --json` lists it."""

    id: str
    role: str = Field(description="conductor or agent")
    provider: str
    model: str
    key_variable: str | None = Field(description="NAME of the variable with its key")
    usable: bool = Field(description="callable here: a key set, or none needed")
    prices: AgentPrices = Field(description="USD per million tokens, each with its source")
    capabilities: dict[str, Any] = Field(description="what its provider can do")
    web_search: str | None
    description: str
    truncation: str | None = Field(default=None, description="why its answers are likely to "
                                   "be cut short (engine/providers/budget.py), or null")


def _listing(pool: Pool) -> list[AgentListing]:
    offered = {a.id for a in pool.available()}
    listed = []
    for a in [pool.conductor, *pool.agents]:
        caps = capabilities(a.provider)
        listed.append(AgentListing(
            id=a.id, role="conductor" if a is pool.conductor else "agent",
            provider=a.provider, model=a.model, key_variable=a.api_key_env,
            usable=a.id in offered or a is pool.conductor, prices=agent_prices(a),
            capabilities={
                "structured_output": caps.structured_output,
                "web_search_options": None if caps.web_search_options is None
                else sorted(caps.web_search_options),
                "trained_versions": caps.trained_versions,
            },
            web_search=a.web_search.summary() if a.web_search else None,
            description=a.description,
            truncation=truncation_risk(a) if a is not pool.conductor else None,
        ))
    return listed


def _price(p: Price) -> str:
    return "?" if p.per_mtok is None else f"{p.per_mtok:g}"


def _source(prices: AgentPrices) -> str:
    sources = dict.fromkeys([prices.input.source, prices.output.source])
    return " + ".join(sources) + (" (tiered)" if prices.tiered else "")


@pool_app.command("show")
def pool_show(
    pool: PoolOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the agents as JSON")] = False,
) -> None:
    """List the agents, whether each is usable here, and what they cost (and where each price
    comes from: the pool file, the genai-prices table, local, or unknown). A reasoning model
    whose max_tokens or timeout is likely to cut its answers short gets a warning line."""
    settings = load_settings(pool)
    agents = _listing(load_pool(settings))
    if as_json:
        out.print_json(json.dumps([a.model_dump() for a in agents]))
        return
    headers = ("id", "provider", "model", "key variable", "usable", "$/M in", "$/M out",
               "price source", "web search", "description")
    rows = [(a.id + (" (conductor)" if a.role == "conductor" else ""), a.provider, a.model,
             a.key_variable or "-", "yes" if a.usable else "no (key not set)",
             _price(a.prices.input), _price(a.prices.output), _source(a.prices),
             a.web_search or "-", a.description) for a in agents]
    for part in fitted_table(f"pool: {settings.pool_file or 'default'}", headers, rows,
                             out.width):
        out.print(part, soft_wrap=True)
    for a in agents:  # below the table, whole, however narrow the terminal
        if a.truncation:
            err.print(f"warning: {a.id}: likely to truncate: {a.truncation}; raise it in the "
                      "pool file (docs/how-to/benchmarks.md, the paper's pool)", markup=False,
                      highlight=False, soft_wrap=True)

