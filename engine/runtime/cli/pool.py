"""`conductor pool show` and `conductor plan check`: the agent pool, and whether a conductor
completion parses as a plan against it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel, Field

from conductor_engine.engine.contracts.tasks import RunOptions
from conductor_engine.engine.plan.language import PlanError, parse_plan
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.providers.prices import AgentPrices, Price, agent_prices
from conductor_engine.engine.providers.registry import capabilities
from conductor_engine.engine.runtime.cli.app import (
    PoolOpt,
    fail,
    field_range,
    load_pool,
    load_settings,
    out,
    plan_app,
    pool_app,
)
from conductor_engine.engine.runtime.cli.render import fitted_table

MAX_POOL_SIZE = 1000
"""Most agents `plan check --pool-size` numbers: far above any real pool."""


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
    comes from: the pool file, the genai-prices table, local, or unknown)."""
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


@plan_app.command("check")
def plan_check(
    file: Annotated[str, typer.Argument(help="a file with the conductor's completion, or -")] = "-",
    pool: PoolOpt = None,
    pool_size: Annotated[int | None, typer.Option(
        help="check against agents numbered 0..N-1 instead of a pool", min=1,
        max=MAX_POOL_SIZE)] = None,
    max_steps: Annotated[int, typer.Option(
        help="most steps in a plan", **field_range(RunOptions, "max_steps"))] = 5,
    allow_empty: Annotated[bool, typer.Option(help="accept an empty plan")] = False,
) -> None:
    """Parse a conductor completion; print the plan as JSON, or why it is invalid (exit 1)."""
    if file == "-":
        text = sys.stdin.read()
    else:
        path = Path(file)
        if not path.is_file():
            raise fail(f"{path} does not exist")
        text = path.read_text()
    if pool_size is not None:
        ids = [str(i) for i in range(pool_size)]
    else:
        agents = load_pool(load_settings(pool))
        ids = [a.id for a in agents.agents] + [agents.conductor.id]
    try:
        plan = parse_plan(text, ids, max_steps=max_steps, allow_empty=allow_empty)
    except PlanError as e:
        raise fail(f"invalid plan: {e}") from None
    out.print_json(json.dumps(plan.model_dump()))
