"""The `conductor` command line (Typer + Rich), a thin layer over engine.client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from conductor_engine.engine.contracts.records import RunResult
from conductor_engine.engine.contracts.search_attributes import SearchAttributesMissing
from conductor_engine.engine.plan.language import PlanError, parse_plan
from conductor_engine.engine.providers.pool import Pool, PoolError
from conductor_engine.engine.rewards import Reward
from conductor_engine.engine.runtime.client import ConductorClient, ConnectError, RunFailed
from conductor_engine.engine.runtime.embedded import EmbeddedError, EmbeddedTemporal
from conductor_engine.engine.runtime.logging import configure_logging
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.database import DatabaseError, EmbeddedPostgres, database_url
from conductor_engine.engine.storage.trace_store import TraceFilter, TraceStore, TraceSummary
from conductor_engine.engine.storage.traces import Trace
from conductor_engine.engine.tasks.model import RunOptions, Task
from rich.console import Console
from rich.markdown import Markdown
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

app = typer.Typer(help="Conductor engine: a conductor model plans, Temporal runs the plan.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
pool_app = typer.Typer(help="Inspect the agent pool.", no_args_is_help=True)
plan_app = typer.Typer(help="Work with plans.", no_args_is_help=True)
traces_app = typer.Typer(help="List and show recorded traces.", no_args_is_help=True)
tasks_app = typer.Typer(help="Task files (JSONL, Hugging Face datasets).", no_args_is_help=True)
app.add_typer(pool_app, name="pool")
app.add_typer(plan_app, name="plan")
app.add_typer(traces_app, name="traces")
app.add_typer(tasks_app, name="tasks")

out = Console()
err = Console(stderr=True)
T = TypeVar("T")

PoolOpt = Annotated[Path | None, typer.Option("--pool", help="pool TOML file (default: "
                                              "CONDUCTOR_POOL_FILE or the shipped pool)")]


def _settings(pool: Path | None = None) -> Settings:
    settings = Settings()
    if pool is not None:
        settings.pool_file = pool
    configure_logging(settings.log_format, settings.log_level)
    return settings


def _fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine, turning every failure a user can meet into a one-line message."""
    try:
        return asyncio.run(coro)
    except (ConnectError, EmbeddedError, DatabaseError, PoolError, RunFailed, LookupError,
            SearchAttributesMissing) as e:
        raise _fail(str(e)) from None
    except KeyboardInterrupt:
        raise _fail("interrupted", 130) from None


def _load_pool(settings: Settings) -> Pool:
    try:
        return Pool.load(settings.pool_file)
    except PoolError as e:
        raise _fail(str(e)) from None


@contextlib.asynccontextmanager
async def _in_process_worker(
    conductor: ConductorClient, pool: Pool, enabled: bool
) -> AsyncIterator[None]:
    if not enabled:
        yield
        return
    from conductor_engine.engine.contracts.search_attributes import ensure_registered
    from conductor_engine.engine.runtime.worker import (
        build_worker,  # imports workflows and activities: runtime only
    )
    from conductor_engine.engine.storage.shared import close_shared_stores

    await ensure_registered(conductor.client, conductor.settings.temporal_namespace)
    async with build_worker(conductor.client, conductor.settings, pool):
        yield
    await close_shared_stores()


# --- run, submit, status, result -----------------------------------------------------------


def _task(question: str, task_id: str | None, reference: str | None, verifier: str | None,
          max_steps: int, rounds: int, depth: int, temperature: float) -> Task:
    options = RunOptions(max_steps=max_steps, refinement_rounds=rounds, self_call_depth=depth,
                         temperature=temperature)
    fields: dict[str, Any] = {"question": question, "reference": reference,
                              "verifier": verifier, "options": options}
    if task_id:
        fields["id"] = task_id
    return Task(**fields)


QuestionArg = Annotated[str, typer.Argument(help="the task for the conductor")]
IdOpt = Annotated[str | None, typer.Option("--id", help="task id (default: random)")]
RefOpt = Annotated[str | None, typer.Option(help="reference answer")]
VerOpt = Annotated[str | None, typer.Option(help="verifier name")]
StepsOpt = Annotated[int, typer.Option(help="most steps in a plan")]
RoundsOpt = Annotated[int, typer.Option("--rounds", help="refinement rounds after the first")]
DepthOpt = Annotated[int, typer.Option("--depth", help="self-call depth limit")]
TempOpt = Annotated[float, typer.Option(help="conductor sampling temperature")]


@app.command()
def run(
    question: QuestionArg,
    task_id: IdOpt = None,
    reference: RefOpt = None,
    verifier: VerOpt = None,
    max_steps: StepsOpt = 5,
    rounds: RoundsOpt = 0,
    depth: DepthOpt = 2,
    temperature: TempOpt = 1.0,
    pool: PoolOpt = None,
    worker: Annotated[bool | None, typer.Option(
        help="serve the run from this process (default: yes on the embedded stack)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Run one task and wait: prints the answer, the steps and the Temporal UI link."""
    settings = _settings(pool)
    agents = _load_pool(settings)
    task = _task(question, task_id, reference, verifier, max_steps, rounds, depth, temperature)

    async def go() -> RunResult:
        conductor = await ConductorClient.connect(settings)
        in_process = settings.embedded if worker is None else worker
        async with _in_process_worker(conductor, agents, in_process):
            workflow_id = await conductor.submit(task)
            if not as_json:
                err.print(f"run [bold]{workflow_id}[/] · {settings.workflow_url(workflow_id)}",
                          soft_wrap=True)
            with err.status("conducting…", spinner="dots"):
                return await conductor.result(workflow_id)

    result = _run(go())
    if as_json:
        out.print_json(result.model_dump_json())
    else:
        _print_result(result, settings)
    if result.status != "completed":
        raise typer.Exit(2)


@app.command()
def submit(
    question: QuestionArg,
    task_id: IdOpt = None,
    reference: RefOpt = None,
    verifier: VerOpt = None,
    max_steps: StepsOpt = 5,
    rounds: RoundsOpt = 0,
    depth: DepthOpt = 2,
    temperature: TempOpt = 1.0,
) -> None:
    """Start a run and print its workflow id (a worker must be running: `conductor up`)."""
    settings = _settings()
    task = _task(question, task_id, reference, verifier, max_steps, rounds, depth, temperature)

    async def go() -> str:
        return await (await ConductorClient.connect(settings)).submit(task)

    out.print(_run(go()), highlight=False)


@app.command()
def status(workflow_id: str) -> None:
    """Show whether a run is running, completed or failed, and its steps so far."""
    settings = _settings()

    async def go() -> Any:
        return await (await ConductorClient.connect(settings)).status(workflow_id)

    st = _run(go())
    out.print(f"{st.workflow_id}: [bold]{st.status}[/] · {settings.workflow_url(st.workflow_id)}",
              soft_wrap=True)
    if st.progress is not None:
        out.print(_steps_table(st.progress))


@app.command()
def result(
    workflow_id: str,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Wait for a run and print its result."""
    settings = _settings()

    async def go() -> RunResult:
        return await (await ConductorClient.connect(settings)).result(workflow_id)

    res = _run(go())
    if as_json:
        out.print_json(res.model_dump_json())
    else:
        _print_result(res, settings)


def _steps_table(res: RunResult) -> Table:
    table = Table(title="steps", title_justify="left")
    for col in ("round", "step", "agent", "subtask", "saw", "tokens in/out", "s", "attempts"):
        table.add_column(col, overflow="fold")
    for rnd in res.rounds:
        for s in rnd.steps:
            saw = "all" if s.access == "all" else (",".join(str(j + 1) for j in s.saw) or "none")
            table.add_row(
                str(rnd.index + 1), f"{s.index + 1}/{len(rnd.steps)}", s.agent, s.subtask, saw,
                f"{s.usage.input_tokens}/{s.usage.output_tokens}", f"{s.seconds:.1f}",
                str(s.attempts) + (" (self-call)" if s.child_workflow_id else ""),
            )
    return table


def _print_result(res: RunResult, settings: Settings) -> None:
    if res.status == "completed":
        out.print(Panel(Markdown(res.answer or ""), title="answer", title_align="left"))
    else:
        out.print(Panel(res.error or res.status, title=f"[red]{res.status}", title_align="left"))
        last = res.rounds[-1].attempts[-1] if res.rounds and res.rounds[-1].attempts else None
        if last is not None:
            out.print(Panel(last.raw_text, title="conductor's last reply", title_align="left"))
    out.print(_steps_table(res))
    if res.reward is not None:
        out.print(_reward_line(res.reward))
    t = res.totals
    out.print(
        f"plans: {t.plan_calls} · agent calls: {t.agent_calls} · tokens in/out: "
        f"{t.usage.input_tokens}/{t.usage.output_tokens} · cost: ${t.cost_usd:.4f} · "
        f"{t.seconds:.1f}s"
    )
    out.print(f"Temporal UI: {settings.workflow_url(res.workflow_id, res.run_id)}",
              soft_wrap=True)


def _reward_line(reward: Reward) -> str:
    if reward.value is None:
        return f"reward: none ({reward.reason})"
    colour = "green" if reward.value >= reward.weights.correct else "yellow"
    return f"reward: [bold {colour}]{reward.value:g}[/] ({escape(reward.reason)})"


# --- worker, up, down ----------------------------------------------------------------------


async def _serve(settings: Settings, pool: Pool, *, start_embedded: bool) -> None:
    from conductor_engine.engine.contracts.search_attributes import ensure_registered
    from conductor_engine.engine.runtime.worker import build_worker
    from conductor_engine.engine.storage.shared import close_shared_stores

    conductor = await ConductorClient.connect(settings, start_embedded=start_embedded)
    await ensure_registered(conductor.client, settings.temporal_namespace)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with build_worker(conductor.client, settings, pool):
        err.print(f"worker polling [bold]{settings.task_queue}[/] on {settings.address} "
                  f"(namespace {settings.temporal_namespace}); Ctrl-C stops")
        await stop.wait()
    await close_shared_stores()
    err.print("worker stopped")


@app.command()
def worker(pool: PoolOpt = None) -> None:
    """Run a worker against the configured Temporal (address, namespace, TLS from settings)."""
    settings = _settings(pool)
    _run(_serve(settings, _load_pool(settings), start_embedded=False))


@app.command()
def up(pool: PoolOpt = None) -> None:
    """Run the embedded Temporal server and a worker in the foreground; Ctrl-C stops both."""
    settings = _settings(pool)
    agents = _load_pool(settings)
    server = EmbeddedTemporal(settings.data_dir, settings.embedded_port, settings.embedded_ui_port)
    try:
        started = server.start(detached=False)
    except EmbeddedError as e:
        raise _fail(str(e)) from None
    err.print(f"Temporal {'started' if started else 'already running'} on {settings.address} · "
              f"UI {settings.ui_base()}")
    postgres = EmbeddedPostgres(settings.data_dir) if settings.database_url is None else None
    pg_started = False
    try:
        if postgres is not None:
            pg_started = postgres.url() is None
            postgres.start()
            err.print(f"PostgreSQL (traces) {'started' if pg_started else 'already running'} "
                      f"in {postgres.pgdata}")
        _run(_serve(settings, agents, start_embedded=False))
    except EmbeddedError as e:
        raise _fail(str(e)) from None
    finally:
        if started:
            server.stop()
            err.print("Temporal stopped")
        if postgres is not None and pg_started:
            postgres.stop()
            err.print("PostgreSQL stopped")


@app.command()
def down() -> None:
    """Stop the embedded Temporal server and PostgreSQL that `conductor run` left running."""
    settings = _settings()
    server = EmbeddedTemporal(settings.data_dir, settings.embedded_port, settings.embedded_ui_port)
    stopped = [name for name, stop in (("Temporal", server.stop),
                                       ("PostgreSQL", EmbeddedPostgres(settings.data_dir).stop))
               if stop()]
    out.print(f"stopped {' and '.join(stopped)}" if stopped else
              f"no embedded server was started from {settings.data_dir}")


# --- pool and plan -------------------------------------------------------------------------


@pool_app.command("show")
def pool_show(pool: PoolOpt = None) -> None:
    """List the agents, whether each is usable here, and what they cost."""
    settings = _settings(pool)
    agents = _load_pool(settings)
    table = Table(title=f"pool: {settings.pool_file or 'default'}", title_justify="left")
    for col in ("id", "provider", "model", "key variable", "usable", "$/M in", "$/M out",
                "web search", "description"):
        table.add_column(col, overflow="fold")
    offered = {a.id for a in agents.available()}
    for a in [agents.conductor, *agents.agents]:
        role = " (conductor)" if a is agents.conductor else ""
        table.add_row(
            a.id + role, a.provider, a.model, a.api_key_env or "-",
            "yes" if a.id in offered or a is agents.conductor else "no (key not set)",
            f"{a.price_input_per_mtok:g}", f"{a.price_output_per_mtok:g}",
            a.web_search.summary() if a.web_search else "-", a.description,
        )
    out.print(table)


@plan_app.command("check")
def plan_check(
    file: Annotated[str, typer.Argument(help="a file with the conductor's completion, or -")] = "-",
    pool: PoolOpt = None,
    pool_size: Annotated[int | None, typer.Option(
        help="check against agents numbered 0..N-1 instead of a pool")] = None,
    max_steps: StepsOpt = 5,
    allow_empty: Annotated[bool, typer.Option(help="accept an empty plan")] = False,
) -> None:
    """Parse a conductor completion; print the plan as JSON, or why it is invalid (exit 1)."""
    if file == "-":
        text = sys.stdin.read()
    else:
        path = Path(file)
        if not path.is_file():
            raise _fail(f"{path} does not exist")
        text = path.read_text()
    if pool_size is not None:
        ids = [str(i) for i in range(pool_size)]
    else:
        agents = _load_pool(_settings(pool))
        ids = [a.id for a in agents.agents] + [agents.conductor.id]
    try:
        plan = parse_plan(text, ids, max_steps=max_steps, allow_empty=allow_empty)
    except PlanError as e:
        raise _fail(f"invalid plan: {e}") from None
    out.print_json(json.dumps(plan.model_dump()))


# --- batch -----------------------------------------------------------------------------------


def _load_task_file(source: str) -> list[Task]:
    """The valid tasks of a JSONL file (or hf:NAME); bad lines are reported and skipped."""
    from conductor_engine.engine.tasks.files import TaskFileError, load_tasks

    try:
        loaded = load_tasks(source)
    except TaskFileError as e:
        raise _fail(str(e)) from None
    for bad in loaded.errors:
        err.print(f"[yellow]skipped line {bad.line}:[/] {escape(bad.message)}", soft_wrap=True)
    if not loaded.tasks:
        raise _fail(f"no valid task in {source}")
    return list(loaded.tasks)


@app.command()
def batch(
    source: Annotated[str, typer.Argument(
        help="a JSONL task file (or hf:NAME); or `watch` / `report` followed by the NAME")],
    batch_name: Annotated[str | None, typer.Argument(
        metavar="[NAME]", help="the batch, after `watch` or `report`")] = None,
    name: Annotated[str | None, typer.Option(help="batch name (default: the file's stem)")] = None,
    concurrency: Annotated[int, typer.Option(help="most runs in flight at once")] = 50,
    watch: Annotated[bool, typer.Option(help="show live progress until it finishes")] = True,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", help="with `report`: where to write it (default batches/NAME)")] = None,
    pool: PoolOpt = None,
    worker: Annotated[bool | None, typer.Option(
        help="serve the batch from this process (default: yes on the embedded stack)")] = None,
) -> None:
    """Run every task of a file as one batch: `conductor batch tasks.jsonl --concurrency 50
    --name NAME`; re-attach with `conductor batch watch NAME`; rewrite the report with
    `conductor batch report NAME`. Submitting a finished batch again runs only the tasks that
    did not complete."""
    settings = _settings(pool)
    if source in ("watch", "report"):
        if not batch_name:
            raise _fail(f"`conductor batch {source}` needs the batch NAME")
        if source == "watch":
            _run(_watch_batch(settings, batch_name, None))
        else:
            _report_batch(settings, batch_name, out_dir or Path("batches") / batch_name)
        return
    loaded = _load_task_file(source)
    name = name or Path(source.split(":")[-1]).stem
    agents = _load_pool(settings)

    async def go() -> None:
        conductor = await ConductorClient.connect(settings)
        in_process = settings.embedded if worker is None else worker
        async with _in_process_worker(conductor, agents, in_process):
            wid, started = await conductor.submit_batch(name, loaded,
                                                        concurrency=concurrency)
            err.print(f"batch [bold]{name}[/] {'started' if started else 'already running'}: "
                      f"{len(loaded)} tasks, {concurrency} at a time · "
                      f"{settings.workflow_url(wid)}", soft_wrap=True)
            if watch or in_process:
                await _watch_batch(settings, name, conductor)

    _run(go())


async def _watch_batch(settings: Settings, name: str, conductor: ConductorClient | None) -> None:
    """A live progress bar from the batch's `progress` query, until it finishes."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    conductor = conductor or await ConductorClient.connect(settings, start_embedded=False)
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("{task.fields[info]}"))
    with Progress(*columns, console=err, transient=False) as bar:
        job = bar.add_task(name, total=None, info="")
        while True:
            status, p = await conductor.batch_progress(name)
            if p is not None:
                reward = "—" if p.mean_reward is None else f"{p.mean_reward:.3f}"
                bar.update(job, total=p.total, completed=p.done, info=(
                    f"running {p.running} · failed {p.failed} · skipped {p.skipped} · reward "
                    f"{reward} · tokens {p.input_tokens + p.output_tokens:,} · "
                    f"${p.cost_usd:.4f}"))
            if status != "running" and status != "continued_as_new":
                break
            await asyncio.sleep(0.5)
    if status != "completed":
        url = settings.workflow_url(f"batch-{name}")
        raise LookupError(f"batch {name} ended {status}; see {url}")
    if p is not None and p.report_dir:
        out.print(f"report: {p.report_dir}", soft_wrap=True)


def _report_batch(settings: Settings, name: str, out_dir: Path) -> None:
    from conductor_engine.engine.storage.batch_report import summary_markdown, write_report

    async def go() -> dict[str, Any]:
        async with _trace_store(settings) as store:
            traces = await store.batch_traces(name)
        if not traces:
            raise LookupError(f"no traces of batch {name!r} in the trace store")
        return write_report(name, traces, out_dir)

    summary = _run(go())
    out.print(Markdown(summary_markdown(summary)))
    out.print(f"report: {out_dir.absolute()}", soft_wrap=True)


# --- tasks -----------------------------------------------------------------------------------


@tasks_app.command("check")
def tasks_check(
    source: Annotated[str, typer.Argument(help="a JSONL file, or hf:NAME[:CONFIG][@SPLIT]")],
    as_json: Annotated[bool, typer.Option("--json", help="the valid tasks as JSON lines")] = False,
) -> None:
    """Load a task file: count the valid tasks, list bad lines with their numbers (exit 1)."""
    from conductor_engine.engine.tasks.files import TaskFileError, load_tasks

    try:
        loaded = load_tasks(source)
    except TaskFileError as e:
        raise _fail(str(e)) from None
    if as_json:
        for t in loaded.tasks:
            print(t.model_dump_json(exclude_defaults=True))
    verifiers = Counter(t.verifier or "auto" for t in loaded.tasks)
    err.print(f"{len(loaded.tasks)} task(s) ok in {loaded.path} · verifiers: "
              + (", ".join(f"{k} {v}" for k, v in sorted(verifiers.items())) or "none"),
              highlight=False)
    for bad in loaded.errors:
        err.print(f"[red]line {bad.line}:[/] {escape(bad.message)}", highlight=False,
                  soft_wrap=True)
    if loaded.errors:
        raise typer.Exit(1)


# --- traces ----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _trace_store(settings: Settings) -> AsyncIterator[TraceStore]:
    from conductor_engine.engine.storage.blobs import blob_store

    url = await asyncio.to_thread(database_url, settings)
    store = await TraceStore.open(url, blob_store(settings),
                                  blob_threshold=settings.trace_blob_threshold, max_size=2)
    try:
        yield store
    finally:
        await store.close()


@traces_app.command("list")
def traces_list(
    dataset: Annotated[str | None, typer.Option(help="only this dataset")] = None,
    tag: Annotated[str | None, typer.Option(help="only tasks with this tag")] = None,
    task: Annotated[str | None, typer.Option("--task", help="only this task id")] = None,
    policy: Annotated[str | None, typer.Option(help="only this policy (conductor id)")] = None,
    version: Annotated[str | None, typer.Option(help="only this policy version")] = None,
    status: Annotated[str | None, typer.Option(
        help="completed, invalid_plan, failed or cancelled")] = None,
    min_reward: Annotated[float | None, typer.Option(help="reward at least this")] = None,
    max_reward: Annotated[float | None, typer.Option(help="reward at most this")] = None,
    since: Annotated[datetime | None, typer.Option(help="finished at or after (ISO date)")] = None,
    self_calls: Annotated[bool, typer.Option(help="include self-call traces")] = False,
    limit: Annotated[int, typer.Option(help="most rows")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines, one trace each")] = False,
) -> None:
    """List recorded traces, newest first."""
    settings = _settings()
    filters = TraceFilter(
        dataset=dataset, tag=tag, task_id=task, policy_name=policy, policy_version=version,
        status=status, min_reward=min_reward, max_reward=max_reward,
        since=since.astimezone(UTC) if since else None, roots_only=not self_calls,
    )

    async def go() -> list[TraceSummary]:
        async with _trace_store(settings) as store:
            return await store.search(filters, limit=limit)

    rows = _run(go())
    if as_json:
        for r in rows:
            print(r.model_dump_json())
        return
    table = Table(title=f"{len(rows)} trace(s)", title_justify="left")
    for col in ("finished", "workflow", "task", "dataset", "policy", "status", "reward",
                "tokens", "cost $", "s", "question"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            r.finished_at.astimezone().strftime("%Y-%m-%d %H:%M:%S"), r.workflow_id, r.task_id,
            r.dataset or "", f"{r.policy.name}@{r.policy.version}", r.status,
            "" if r.reward is None else f"{r.reward:g}", str(r.input_tokens + r.output_tokens),
            f"{r.cost_usd:.4f}", f"{r.seconds:.1f}", _one_line(r.question, 60),
        )
    out.print(table)


@traces_app.command("show")
def traces_show(
    workflow_id: str,
    run_id: Annotated[str | None, typer.Option(help="a run other than the latest")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="the whole trace as JSON")] = False,
    full: Annotated[bool, typer.Option(help="print outputs in full, not cut")] = False,
) -> None:
    """Show one trace whole: plan attempts, steps, self-calls, answer and reward."""
    settings = _settings()

    async def go() -> Trace | None:
        async with _trace_store(settings) as store:
            return await store.get(workflow_id, run_id)

    trace = _run(go())
    if trace is None:
        raise _fail(f"no trace of {workflow_id!r}: the run may still be going "
                    f"(`conductor status {workflow_id}`) or was recorded to another database")
    if as_json:
        print(trace.model_dump_json(indent=2))
        return
    _print_trace(trace, full=full)
    out.print(f"Temporal UI: {settings.workflow_url(trace.workflow_id, trace.run_id)}",
              soft_wrap=True)


def _one_line(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _print_trace(trace: Trace, *, full: bool, indent: str = "") -> None:
    cut = (lambda t: t) if full else (lambda t: _one_line(t, 300))
    t = trace.totals
    out.print(
        f"{indent}[bold]{trace.workflow_id}[/] · run {trace.run_id} · "
        f"{trace.policy.name}@{trace.policy.version} · [bold]{trace.status}[/] · "
        f"{t.usage.input_tokens}/{t.usage.output_tokens} tokens · ${t.cost_usd:.4f} · "
        f"{t.seconds:.1f}s · {trace.finished_at.astimezone():%Y-%m-%d %H:%M:%S}",
        soft_wrap=True,
    )
    task = trace.task
    where = (f" · dataset {task.dataset}" if task.dataset else "") + (
        f" · tags {', '.join(task.tags)}" if task.tags else "")
    out.print(f"{indent}task {task.id}{where}: {cut(task.question)}", highlight=False,
              soft_wrap=True)
    for rnd in trace.rounds:
        for a in rnd.attempts:
            verdict = "plan ok" if a.plan is not None else f"[red]{escape(a.error or '')}[/]"
            lp = "with logprobs" if a.logprobs is not None else "no logprobs"
            out.print(f"{indent}round {rnd.index + 1} · plan attempt {a.attempt}: {verdict} · "
                      f"{a.usage.output_tokens} tokens, {lp}", soft_wrap=True)
        if rnd.steps:
            table = Table(show_header=True, title_justify="left")
            for col in ("step", "agent", "subtask", "saw", "output", "tokens", "s", "tries"):
                table.add_column(col, overflow="fold")
            for s in rnd.steps:
                saw = ",".join(str(j + 1) for j in s.saw) or "none"
                table.add_row(f"{s.index + 1}", s.agent, cut(s.subtask), saw,
                              cut(s.error or s.output), f"{s.usage.input_tokens}/"
                              f"{s.usage.output_tokens}", f"{s.seconds:.1f}", str(s.attempts))
            out.print(table)
    if trace.answer is not None:
        out.print(Panel(cut(trace.answer), title="answer", title_align="left"))
    if trace.error:
        out.print(f"{indent}[red]error:[/] {escape(trace.error)}", soft_wrap=True)
    if trace.reward is not None:
        out.print(indent + _reward_line(trace.reward))
    for child in trace.children:
        out.print(f"{indent}└ self-call:")
        _print_trace(child, full=full, indent=indent + "  ")


# --- history and resume (Temporal history, no database) -------------------------------------

if TYPE_CHECKING:
    from collections.abc import Callable

    from conductor_engine.engine.runtime.history import AttemptError, Trail, TrailRound
    from conductor_engine.engine.runtime.resume import ResumePlan
    from temporalio.client import Client


@app.command()
def history(
    workflow_id: str,
    run_id: Annotated[str | None, typer.Option(help="a run other than the latest")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="the trail as JSON")] = False,
    full: Annotated[bool, typer.Option(help="print outputs in full, not cut")] = False,
) -> None:
    """A run's step trail from its Temporal history alone: what each agent was asked, saw and
    answered, tokens, cost, attempts and errors. Works for running and failed runs too."""
    from conductor_engine.engine.runtime.history import HistoryError, step_trail

    settings = _settings()

    async def go() -> Trail:
        conductor = await ConductorClient.connect(settings)
        return await step_trail(conductor.client, workflow_id, run_id)

    try:
        trail = _run(go())
    except HistoryError as e:
        raise _fail(str(e)) from None
    if as_json:
        print(trail.model_dump_json(indent=2))
        return
    _print_trail(trail, full=full)
    out.print(f"Temporal UI: {settings.workflow_url(trail.workflow_id, trail.run_id)}",
              soft_wrap=True)


def _attempt_errors(errors: list[AttemptError]) -> str:
    return "\n".join(f"#{e.attempt or '?'}: {e.message}" for e in errors)


def _print_trail(trail: Trail, *, full: bool) -> None:
    cut = (lambda t: t) if full else (lambda t: _one_line(t, 300))
    engine_status = f" ({trail.run_status})" if trail.run_status not in (None, trail.status) \
        else ""
    out.print(f"[bold]{trail.workflow_id}[/] · run {trail.run_id} · [bold]{trail.status}[/]"
              f"{engine_status} · {trail.usage.input_tokens}/{trail.usage.output_tokens} tokens"
              f" · ${trail.cost_usd:.4f} · {trail.events} events", soft_wrap=True)
    if trail.reset is not None:
        out.print(f"resumed from run {trail.reset.base_run_id} (event {trail.reset.event_id}: "
                  f"{escape(trail.reset.reason)}); its failures: conductor history "
                  f"{trail.workflow_id} --run-id {trail.reset.base_run_id}", soft_wrap=True,
                  highlight=False)
    if trail.task is not None:
        out.print(f"task {trail.task.id}: {escape(cut(trail.task.question))}", highlight=False,
                  soft_wrap=True)
    for rnd in trail.rounds:
        _print_trail_round(rnd, cut)
    if trail.answer is not None:
        out.print(Panel(escape(cut(trail.answer)), title="answer", title_align="left"))
    if trail.error:
        out.print(f"[red]error:[/] {escape(trail.error)}", soft_wrap=True)
    if trail.reward is not None:
        out.print(_reward_line(trail.reward))
    for child in trail.self_calls:
        out.print(f"└ self-call: conductor history {child}", highlight=False, soft_wrap=True)


def _print_trail_round(rnd: TrailRound, cut: Callable[[str], str]) -> None:
    for a in rnd.plan_attempts:
        if a.status != "done":
            verdict = f"[red]{a.status}[/]"
        elif a.plan is not None:
            verdict = f"plan ok ({len(a.plan)} steps)"
        else:
            verdict = f"[red]rejected: {escape(a.error or '')}[/]"
        out.print(f"round {rnd.index + 1} · plan attempt {a.attempt}: {verdict} · "
                  f"{a.usage.output_tokens} tokens · {a.attempts} call(s)", soft_wrap=True)
        if a.errors:
            out.print(escape(_attempt_errors(a.errors)), soft_wrap=True, highlight=False)
    if not rnd.steps:
        return
    table = Table(show_header=True)
    for col in ("round", "step", "agent", "subtask", "saw", "status", "output", "tokens",
                "cost $", "attempts", "errors"):
        table.add_column(col, overflow="fold")
    for s in rnd.steps:
        saw = ",".join(str(j + 1) for j in s.saw) or "none"
        table.add_row(
            str(rnd.index + 1), f"{s.index + 1}/{len(rnd.steps)}", s.agent,
            escape(cut(s.subtask)), saw, s.status, escape(cut(s.output or "")),
            f"{s.usage.input_tokens}/{s.usage.output_tokens}", f"{s.cost_usd:.4f}",
            str(s.attempts) + (" (self-call)" if s.child_workflow_id else ""),
            escape(_attempt_errors(s.errors)),
        )
    out.print(table)


@app.command("resume")
def resume_runs(
    workflow_id: Annotated[str | None, typer.Argument(help="the failed run's workflow id")] = None,
    batch: Annotated[str | None, typer.Option(help="resume every failed run of a batch")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="reset without asking")] = False,
) -> None:
    """Resume failed runs: reset each to just before its failed step. Steps that completed are
    kept (their agents are not called again); the failed step and the rest run anew. A worker
    must be serving the task queue (`conductor up`) for the resumed runs to proceed."""
    from conductor_engine.engine.runtime.history import HistoryError
    from conductor_engine.engine.runtime.resume import ResumeError

    if (workflow_id is None) == (batch is None):
        raise _fail("give a workflow id or --batch NAME")
    settings = _settings()
    try:
        resumed = _run(_resume(settings, workflow_id, batch, yes))
    except (ResumeError, HistoryError) as e:
        raise _fail(str(e)) from None
    for wid, run_id, problem in resumed:
        if run_id is None:
            err.print(f"[bold red]error:[/] {escape(problem or '')}", soft_wrap=True)
            continue
        out.print(f"resumed {wid}: new run {run_id} · {settings.workflow_url(wid, run_id)}",
                  highlight=False, soft_wrap=True)
    if any(run_id is None for _, run_id, _ in resumed):
        raise typer.Exit(1)


async def _resume(
    settings: Settings, workflow_id: str | None, batch: str | None, yes: bool
) -> list[tuple[str, str | None, str | None]]:
    """Plan, show, confirm, reset: on one client and one event loop (a second client in a
    second loop can crash the interpreter as it exits)."""
    client = (await ConductorClient.connect(settings)).client
    plans = await _resume_plans(client, workflow_id, batch)
    if not plans:
        out.print(f"no failed runs in batch {batch}", highlight=False)
        return []
    for plan in plans:
        _print_resume_plan(plan)
    if not yes and not await asyncio.to_thread(typer.confirm, f"Reset {len(plans)} run(s)?"):
        raise typer.Abort()
    return await _reset_all(client, plans)


async def _resume_plans(
    client: Client, workflow_id: str | None, batch: str | None
) -> list[ResumePlan]:
    """One run's plan (its errors are the user's to see), or those of a batch's failed runs
    (a run that cannot be planned is reported and skipped)."""
    from conductor_engine.engine.runtime.resume import ResumeError, failed_runs, plan_resume

    if workflow_id is not None:
        return [await plan_resume(client, workflow_id)]
    assert batch is not None
    plans = []
    for wid in await failed_runs(client, batch):
        try:
            plans.append(await plan_resume(client, wid))
        except ResumeError as e:
            err.print(f"[yellow]skipped:[/] {escape(str(e))}", soft_wrap=True)
    return plans


async def _reset_all(
    client: Client, plans: list[ResumePlan]
) -> list[tuple[str, str | None, str | None]]:
    """(workflow id, new run id or None, why not) for each plan: one run that cannot be reset
    (resumed meanwhile by someone else) does not stop the others."""
    from conductor_engine.engine.runtime.resume import ResumeError, resume

    done: list[tuple[str, str | None, str | None]] = []
    for p in plans:
        try:
            done.append((p.workflow_id, await resume(client, p, reason="conductor resume"), None))
        except ResumeError as e:
            done.append((p.workflow_id, None, str(e)))
    return done


def _print_resume_plan(plan: ResumePlan) -> None:
    out.print(f"[bold]{plan.workflow_id}[/] · run {plan.run_id} · [bold]{plan.status}[/]"
              + (f": {escape(plan.error)}" if plan.error else ""), soft_wrap=True)
    where = f"just before {plan.failed.label()}" if plan.failed else "after its last progress"
    out.print(f"reset to event {plan.reset_event_id} ({where})", highlight=False)
    out.print("kept (not called again):" if plan.kept else "kept: nothing")
    for i in plan.kept:
        out.print(f"  {i.label()}" + (f" · {escape(_one_line(i.subtask, 80))}" if i.subtask
                                      else ""), highlight=False, soft_wrap=True)
    out.print("redone:")
    for i in plan.redone:
        out.print(f"  {i.label()} · {escape(i.why or '')}", highlight=False, soft_wrap=True)
    for note in plan.notes:
        out.print(f"note: {escape(note)}", highlight=False, soft_wrap=True)
    out.print(f"same with Temporal's CLI: {escape(plan.command)}", highlight=False,
              soft_wrap=True)


def main() -> None:  # pragma: no cover
    """The `conductor` command. It leaves through os._exit once its output is flushed: the
    Temporal SDK's Rust core can abort the interpreter's normal shutdown (temporalio/sdk-python
    issue 300), turning a finished command into a crash."""
    code = 0
    try:
        app()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


# `conductor train ...` and `conductor trainer` live in their own module; importing it
# registers them on `app`.
from conductor_engine.engine.runtime.cli import train  # noqa: E402, F401
