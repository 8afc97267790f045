"""The `conductor` command line (Typer + Rich), a thin layer over engine.client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markdown import Markdown
from rich.panel import Panel
from rich.table import Table

from engine.client import ConductorClient, ConnectError, RunFailed
from engine.embedded import EmbeddedError, EmbeddedTemporal
from engine.logging import configure_logging
from engine.plan import PlanError, parse_plan
from engine.pool import Pool, PoolError
from engine.records import RunResult
from engine.settings import Settings
from engine.task import RunOptions, Task

app = typer.Typer(help="Conductor engine: a conductor model plans, Temporal runs the plan.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
pool_app = typer.Typer(help="Inspect the agent pool.", no_args_is_help=True)
plan_app = typer.Typer(help="Work with plans.", no_args_is_help=True)
app.add_typer(pool_app, name="pool")
app.add_typer(plan_app, name="plan")

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
    except (ConnectError, EmbeddedError, PoolError, RunFailed, LookupError) as e:
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
    from engine.worker import build_worker  # imports workflows and activities: runtime only

    async with build_worker(conductor.client, conductor.settings, pool):
        yield


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
    t = res.totals
    out.print(
        f"plans: {t.plan_calls} · agent calls: {t.agent_calls} · tokens in/out: "
        f"{t.usage.input_tokens}/{t.usage.output_tokens} · cost: ${t.cost_usd:.4f} · "
        f"{t.seconds:.1f}s"
    )
    out.print(f"Temporal UI: {settings.workflow_url(res.workflow_id, res.run_id)}",
              soft_wrap=True)


# --- worker, up, down ----------------------------------------------------------------------


async def _serve(settings: Settings, pool: Pool, *, start_embedded: bool) -> None:
    from engine.worker import build_worker

    conductor = await ConductorClient.connect(settings, start_embedded=start_embedded)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with build_worker(conductor.client, settings, pool):
        err.print(f"worker polling [bold]{settings.task_queue}[/] on {settings.address} "
                  f"(namespace {settings.temporal_namespace}); Ctrl-C stops")
        await stop.wait()
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
    try:
        _run(_serve(settings, agents, start_embedded=False))
    finally:
        if started:
            server.stop()
            err.print("Temporal stopped")


@app.command()
def down() -> None:
    """Stop the embedded Temporal server that `conductor run` left running."""
    settings = _settings()
    server = EmbeddedTemporal(settings.data_dir, settings.embedded_port, settings.embedded_ui_port)
    out.print("stopped" if server.stop() else "no embedded server was started from "
              f"{settings.data_dir}")


# --- pool and plan -------------------------------------------------------------------------


@pool_app.command("show")
def pool_show(pool: PoolOpt = None) -> None:
    """List the agents, whether each is usable here, and what they cost."""
    settings = _settings(pool)
    agents = _load_pool(settings)
    table = Table(title=f"pool: {settings.pool_file or 'default'}", title_justify="left")
    for col in ("id", "provider", "model", "key variable", "usable", "$/M in", "$/M out",
                "description"):
        table.add_column(col, overflow="fold")
    offered = {a.id for a in agents.available()}
    for a in [agents.conductor, *agents.agents]:
        role = " (conductor)" if a is agents.conductor else ""
        table.add_row(
            a.id + role, a.provider, a.model, a.api_key_env or "-",
            "yes" if a.id in offered or a is agents.conductor else "no (key not set)",
            f"{a.price_input_per_mtok:g}", f"{a.price_output_per_mtok:g}", a.description,
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


def main() -> None:  # pragma: no cover
    app()
