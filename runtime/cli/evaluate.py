"""`conductor eval`: the same tasks through the conductor and its baselines (engine/eval), as
one batch of ordinary runs, then one comparison table (terminal, Markdown, JSON, bar chart)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.text import Text

from conductor_engine.engine.contracts.limits import MAX_CONCURRENCY
from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.eval import BASELINES, EvalOutcome, EvalSpec, eval_agents, run_eval
from conductor_engine.engine.eval.report import (
    HEADER,
    NARROW_HEADER,
    cells,
    failure_note,
    narrow_cells,
    narrow_header,
)
from conductor_engine.engine.eval.suite_report import SuiteRow
from conductor_engine.engine.eval.suite_report import cells as suite_cells
from conductor_engine.engine.eval.suite_report import failure_note as suite_failure_note
from conductor_engine.engine.eval.suite_report import header as suite_header
from conductor_engine.engine.eval.systems import MAX_REPEATS
from conductor_engine.engine.eval.usable import INCLUDE_HINT, described
from conductor_engine.engine.tasks.suite import Suite, SuiteError, load_suite
from conductor_engine.runtime.cli.app import (
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
from conductor_engine.runtime.cli.batches import progress_columns, progress_info
from conductor_engine.runtime.cli.render import column_widths, fitted_table
from conductor_engine.runtime.client import ConductorClient

if TYPE_CHECKING:
    from conductor_engine.workflows.batch import BatchProgress


@app.command(name="eval")
def evaluate(
    tasks: Annotated[str | None, typer.Argument(
        help="a JSONL task file, hf:NAME, or a benchmark in its own shape: SHAPE:FILE with "
             "SHAPE one of gpqa, math, math500, aime, mmlu, mmlu-pro, rlpr, code "
             "(LiveCodeBench), humaneval, mbpp (FILE a JSONL file or hf:NAME); or none "
             "with --suite")] = None,
    name: Annotated[str | None, typer.Option(
        help="the eval's name (its batch is NAME; default with --suite: the suite's name)")
    ] = None,
    suite: Annotated[str | None, typer.Option(
        help="run a benchmark suite instead of TASKS: a shipped one (paper: GPQA-Diamond, "
             "LiveCodeBench, MATH500, AIME 2025) or a suite file (TOML, "
             "docs/how-to/benchmarks.md); "
             "the report adds a table with a column per benchmark")] = None,
    limit: Annotated[int | None, typer.Option(
        min=1, max=1_000_000,
        help="only the first N tasks (of each benchmark with --suite): a cheap first run")
    ] = None,
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
    repeats: Annotated[int, typer.Option(
        min=1, max=MAX_REPEATS,
        help=f"runs of each task by each system (1..{MAX_REPEATS}); the table's figures are "
             "means over all of them: with agents that sample, one run a task on a few tasks "
             "measures luck")] = 1,
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
    include_unusable: Annotated[bool, typer.Option(
        "--include-unusable", help="also run the agents that cannot run here (a key not set, "
        "a server that does not answer), which are left out by default; their runs fail and "
        "are counted as failed")] = False,
) -> None:
    """Compare the conductor with every single agent, the best of them, Mixture-of-Agents, a
    random plan and a planner -> executor -> verifier chain on the same tasks: accuracy, mean
    reward, tokens, cost, latency and calls per task. Every run is a Temporal workflow of one
    batch (NAME): an interrupted eval resumes where it stopped when run again.

    `--suite paper` runs the Conductor paper's benchmarks as one eval and adds its table: a
    column per benchmark, their average, tokens and cost per task, the published figures.

    Agents that cannot run here (`conductor pool show` says `usable: no`, or their server does
    not answer) are left out before the eval starts, in one line saying which and why. A run
    that fails anyway has no result: each row counts its failed runs beside an accuracy over
    the runs that completed (marked *), or n/a when none did."""
    if (tasks is None) == (suite is None):
        raise fail("give TASKS (a task file or SHAPE:SOURCE) or --suite NAME|FILE, not "
                   f"{'both' if tasks else 'neither'}", 2)
    chosen_suite = _load_suite(suite) if suite is not None else None
    name = name or (chosen_suite.name if chosen_suite is not None else None)
    if name is None:
        raise fail("--name is required: the eval's name (its batch is NAME)", 2)
    settings = load_settings(pool)
    agents = load_pool(settings)
    try:
        taking_part = eval_agents(agents, include=include_unusable, aggregator=aggregator)
    except ValueError as e:
        raise fail(str(e), 2) from None
    if taking_part.left_out:
        err.print(Text(f"left out {len(taking_part.left_out)} agent(s) that cannot run here: "
                       f"{described(taking_part.left_out)}; {INCLUDE_HINT}"),
                  highlight=False, soft_wrap=True)
    chosen = [b.strip() for b in baselines.split(",") if b.strip() and b.strip() != "none"]
    try:
        spec = EvalSpec(agents=taking_part.agents, policy_version=policy,
                        baselines=chosen, rounds=rounds, moa_layers=moa_layers,  # type: ignore[arg-type]
                        aggregator=aggregator, seed=seed, repeats=repeats,
                        conductor_agents=taking_part.conductor_agents)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        hint = f" (baselines: {', '.join(BASELINES)})" if "baselines" in where else ""
        raise fail(f"{where + ': ' if where else ''}{first['msg']}{hint}", 2) from None
    if chosen_suite is not None:
        if column:
            raise fail("--column does not apply with --suite: a suite file maps each "
                       "benchmark's columns itself ([[benchmarks]] columns)", 2)
        loaded = _suite_tasks(chosen_suite, strict=strict, seed=seed, limit=limit)
    else:
        assert tasks is not None
        options = _shape_options(tasks, column, seed)
        if limit is not None and options:
            options["limit"] = limit  # a shaped source stops reading after N rows
        loaded = load_task_file(tasks, skip_bad=not strict, **options)[:limit]
    target = out_dir or Path("evals") / name

    def submitted(started: bool, runs: int) -> None:
        each = f" x {repeats} runs" if repeats > 1 else ""
        err.print(f"eval {name} {'started' if started else 'already running'}: "
                  f"{len(loaded)} tasks x {runs // max(1, len(loaded) * repeats)} systems{each}",
                  markup=False, highlight=False)

    async def go() -> EvalOutcome:
        conductor = await ConductorClient.connect(settings, pool=agents)
        in_process = settings.embedded if worker is None else worker
        async with in_process_worker(conductor, agents, in_process):
            with _progress_bar(name) as show:
                return await run_eval(conductor, lambda: open_trace_store(settings), name,
                                      loaded, spec, out_dir=target, suite=chosen_suite,
                                      concurrency=concurrency, json_file=json_file,
                                      on_submitted=submitted, on_progress=show)

    outcome = run_async(go())
    _show_table(outcome, target)
    if chosen_suite is not None and outcome.suite_rows is not None:
        _show_suite_table(chosen_suite, outcome.suite_rows)
    for path in outcome.written:
        out.print(f"wrote {path}", markup=False, highlight=False)


@contextlib.contextmanager
def _progress_bar(name: str) -> Iterator[Callable[[BatchProgress], None]]:
    """The batch's live bar (the one `conductor batch` draws), fed each progress answer."""
    from rich.progress import Progress

    with Progress(*progress_columns(), console=err, transient=False, expand=True) as bar:
        job = bar.add_task(name, total=None, info="")
        yield lambda p: bar.update(job, total=p.total, completed=p.done, info=progress_info(p))


def _show_table(outcome: EvalOutcome, target: Path) -> None:
    """The comparison table fitted to the terminal: the main columns when it is narrow."""
    rows = outcome.rows
    title = f"eval {outcome.name}: {outcome.tasks} tasks"
    header: tuple[str, ...] = HEADER
    table = [cells(r) for r in rows]
    if column_widths(header, table, out.width) is None:  # narrow: the main columns
        title += f" (the main columns; {target / 'table.md'} has all)"
        header = narrow_header(rows)
        table = [narrow_cells(r, header is not NARROW_HEADER) for r in rows]
    for part in fitted_table(title, header, table, out.width):
        out.print(part, soft_wrap=True)
    note = failure_note(rows)
    if note:
        out.print(Text(f"{note}; `conductor batch report {outcome.name}` says why each failed"))


def _load_suite(suite: str) -> Suite:
    try:
        return load_suite(suite)
    except SuiteError as e:
        raise fail(str(e), 2) from None


def _suite_tasks(suite: Suite, *, strict: bool, seed: int, limit: int | None) -> list[Task]:
    """Every benchmark's tasks, each loaded as `conductor eval SHAPE:SOURCE` loads one (bad
    rows listed, the rest run unless --strict), renamed `KEY/ID` with the suite's options."""
    out: list[Task] = []
    for benchmark, source in suite.sources():
        options: dict[str, Any] = {"columns": benchmark.columns, "seed": seed}
        if limit is not None:
            options["limit"] = limit
        err.print(f"{benchmark.name}: reading {source}", markup=False, highlight=False)
        loaded = load_task_file(source, skip_bad=not strict, **options)  # fails: says why
        err.print(f"{benchmark.name}: {len(loaded)} task(s)", markup=False, highlight=False)
        out += [suite.task(benchmark, t) for t in loaded]
    return out


def _show_suite_table(suite: Suite, rows: list[SuiteRow]) -> None:
    """The paper-shaped table: a column per benchmark, their average, the published row."""
    head, table = suite_header(suite, rows), [suite_cells(r) for r in rows]
    title = f"suite {suite.name}: accuracy (%) per benchmark and their average"
    for part in fitted_table(title, head, table, out.width):
        out.print(part, soft_wrap=True)
    note = suite_failure_note(rows)
    if note:
        out.print(Text(note))
    if any(r.published for r in rows):
        out.print(f"last row published, not measured: {suite.citation}", markup=False,
                  highlight=False, soft_wrap=True)


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
