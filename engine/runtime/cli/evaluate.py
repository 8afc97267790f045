"""`conductor eval`: the same tasks through the conductor and its baselines (engine/eval), as
one batch of ordinary runs, then one comparison table (terminal, Markdown, JSON, bar chart)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from conductor_engine.engine.contracts.limits import MAX_CONCURRENCY
from conductor_engine.engine.eval import BASELINES, EvalSpec, eval_tasks, system_rows, write_report
from conductor_engine.engine.eval.report import (
    HEADER,
    NARROW_HEADER,
    cells,
    narrow_cells,
    rows_json,
)
from conductor_engine.engine.runtime.cli.app import (
    PoolOpt,
    app,
    err,
    fail,
    in_process_worker,
    load_pool,
    load_settings,
    load_task_file,
    open_trace_store,
    out,
    run_async,
)
from conductor_engine.engine.runtime.cli.batches import _watch_batch
from conductor_engine.engine.runtime.cli.render import column_widths, fitted_table
from conductor_engine.engine.runtime.client import ConductorClient


@app.command(name="eval")
def evaluate(
    tasks: Annotated[str, typer.Argument(
        help="a JSONL task file, hf:NAME, or a benchmark in its own shape: SHAPE:FILE with "
             "SHAPE one of gpqa, math, math500, aime, mmlu, mmlu-pro, rlpr, code "
             "(LiveCodeBench), humaneval, mbpp (FILE a JSONL file or hf:NAME)")],
    name: Annotated[str, typer.Option(help="the eval's name (its batch is NAME)")],
    pool: PoolOpt = None,
    policy: Annotated[str | None, typer.Option(
        help="the conductor's policy version (base, latest, vN; default: the pool file's)")
    ] = None,
    baselines: Annotated[str, typer.Option(
        help=f"comma-separated baselines among {', '.join(BASELINES)}, or none")
    ] = ",".join(BASELINES),
    rounds: Annotated[int, typer.Option(
        min=0, max=5, help="also the conductor with 1..N refinement rounds (0..5)")] = 0,
    moa_layers: Annotated[int, typer.Option(
        min=1, max=4, help="Mixture-of-Agents proposer layers before the aggregator (1..4)")
    ] = 2,
    aggregator: Annotated[str | None, typer.Option(
        help="MoA's aggregator and the chain's agent (default: the pool's first agent)")
    ] = None,
    seed: Annotated[int, typer.Option(
        min=0, max=2**31, help="seeds the random plans and gpqa: choice shuffles")] = 0,
    column: Annotated[list[str] | None, typer.Option(
        help="with SHAPE:FILE, FIELD=COLUMN where the source names a field otherwise "
             "(repeatable), e.g. --column question=Problem")] = None,
    concurrency: Annotated[int, typer.Option(
        min=1, max=MAX_CONCURRENCY, help=f"most runs in flight at once, at most "
        f"{MAX_CONCURRENCY} (Temporal's pending-children limit)")] = 50,
    json_file: Annotated[Path | None, typer.Option(
        "--json", help="also write the rows as a JSON list to this file")] = None,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", help="report directory (default evals/NAME)")] = None,
    worker: Annotated[bool | None, typer.Option(
        help="serve the runs from this process (default: yes on the embedded stack)")] = None,
    strict: Annotated[bool, typer.Option(
        help="refuse the eval when any row is bad (default: list bad rows, run the rest)")
    ] = False,
) -> None:
    """Compare the conductor with every single agent, the best of them, Mixture-of-Agents, a
    random plan and a planner -> executor -> verifier chain on the same tasks: accuracy, mean
    reward, tokens, cost, latency and calls per task. Every run is a Temporal workflow of one
    batch (NAME): an interrupted eval resumes where it stopped when run again."""
    settings = load_settings(pool)
    agents = load_pool(settings)
    chosen = [b.strip() for b in baselines.split(",") if b.strip() and b.strip() != "none"]
    try:
        spec = EvalSpec(agents=[a.id for a in agents.agents], policy_version=policy,
                        baselines=chosen, rounds=rounds, moa_layers=moa_layers,  # type: ignore[arg-type]
                        aggregator=aggregator, seed=seed)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        hint = f" (baselines: {', '.join(BASELINES)})" if "baselines" in where else ""
        raise fail(f"{where + ': ' if where else ''}{first['msg']}{hint}", 2) from None
    loaded = load_task_file(tasks, skip_bad=not strict, **_shape_options(tasks, column, seed))
    runs = eval_tasks(loaded, spec)
    target = out_dir or Path("evals") / name

    async def go() -> None:
        conductor = await ConductorClient.connect(settings)
        in_process = settings.embedded if worker is None else worker
        async with in_process_worker(conductor, agents, in_process):
            _, started = await conductor.submit_batch(name, runs, concurrency=concurrency,
                                                      report=False)
            err.print(f"eval {name} {'started' if started else 'already running'}: "
                      f"{len(loaded)} tasks x {len(runs) // max(1, len(loaded))} systems",
                      markup=False, highlight=False)
            await _watch_batch(settings, name, conductor)
        async with open_trace_store(settings) as store:
            traces = await store.batch_traces(name, resolve_blobs=False)
        rows = system_rows(traces)
        title = f"eval {name}: {len(loaded)} tasks"
        header: tuple[str, ...] = HEADER
        table = [cells(r) for r in rows]
        if column_widths(header, table, out.width) is None:  # narrow: the main columns
            title += f" (the main columns; {target / 'table.md'} has all)"
            header, table = NARROW_HEADER, [narrow_cells(r) for r in rows]
        for part in fitted_table(title, header, table, out.width):
            out.print(part, soft_wrap=True)
        for path in write_report(name, rows, target):
            out.print(f"wrote {path}", markup=False, highlight=False)
        if json_file is not None:
            json_file.write_text(json.dumps(rows_json(rows), indent=2) + "\n")

    run_async(go())


def _shape_options(source: str, columns: list[str] | None, seed: int) -> dict[str, Any]:
    """The loader options of a SHAPE:SOURCE source (engine/tasks/benchmark_shapes.py)."""
    from conductor_engine.engine.tasks.benchmark_shapes import shape_of

    if shape_of(source) is None:
        if columns:
            raise fail("--column applies to SHAPE:FILE sources only (gpqa:, math:, code:, ...)",
                       2)
        return {}
    mapping = {}
    for item in columns or []:
        field, sep, name = item.partition("=")
        if not sep or not field.strip() or not name.strip():
            raise fail(f"--column {item!r}: write FIELD=COLUMN, e.g. question=Problem", 2)
        mapping[field.strip()] = name.strip()
    return {"columns": mapping, "seed": seed}
