"""`conductor plan check`: whether a conductor completion parses as a plan against the pool."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from conductor_engine.engine.contracts.tasks import RunOptions
from conductor_engine.engine.plan.language import PlanError, parse_plan
from conductor_engine.runtime.cli.app import (
    PoolOpt,
    fail,
    field_range,
    load_pool,
    load_settings,
    out,
    plan_app,
)

MAX_POOL_SIZE = 1000
"""Most agents `plan check --pool-size` numbers: far above any real pool."""


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
