"""`conductor run`, `submit`, `status` and `result`: one task at a time, and how a run's result
is printed (answer, step table, reward, totals, Temporal UI link)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.markdown import Markdown
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from conductor_engine.engine.contracts.records import RunResult
from conductor_engine.engine.contracts.tasks import RunOptions, Task
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.tasks.checks import check_size, check_storable
from conductor_engine.runtime.cli.app import (
    PoolOpt,
    app,
    err,
    fail,
    field_range,
    in_process_worker,
    load_pool,
    load_settings,
    out,
    run_async,
)
from conductor_engine.runtime.cli.render import (
    Column,
    Fitted,
    record_rows,
    reward_line,
    steps_table,
)
from conductor_engine.runtime.client import ConductorClient, RunStatus

QuestionArg = Annotated[str, typer.Argument(help="the task for the conductor")]
IdOpt = Annotated[str | None, typer.Option("--id", help="task id (default: random)")]
RefOpt = Annotated[str | None, typer.Option(help="reference answer")]
VerOpt = Annotated[str | None, typer.Option(help="verifier name")]
StepsOpt = Annotated[int, typer.Option(help="most steps in a plan",
                                       **field_range(RunOptions, "max_steps"))]
RoundsOpt = Annotated[int, typer.Option("--rounds", help="refinement rounds after the first",
                                        **field_range(RunOptions, "refinement_rounds"))]
DepthOpt = Annotated[int, typer.Option("--depth", help="self-call depth limit",
                                       **field_range(RunOptions, "self_call_depth"))]
TempOpt = Annotated[float, typer.Option(help="conductor sampling temperature",
                                        **field_range(RunOptions, "temperature"))]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the result as JSON")]

# The answer is printed above the table, so a run's table shows no outputs.
RUN_COLUMNS: tuple[Column, ...] = ("round", "step", "agent", "subtask", "sees", "tokens",
                                   "seconds", "attempts")


def _task(question: str, task_id: str | None, reference: str | None, verifier: str | None,
          max_steps: int, rounds: int, depth: int, temperature: float) -> Task:
    options = RunOptions(max_steps=max_steps, refinement_rounds=rounds, self_call_depth=depth,
                         temperature=temperature)
    fields: dict[str, Any] = {"question": question, "reference": reference,
                              "verifier": verifier, "options": options}
    if task_id:
        fields["id"] = task_id
    try:  # arguments made of bytes that are not UTF-8 arrive as lone surrogates
        check_storable(fields)
        task = Task(**fields)
        check_size(task)  # one line before anything connects or starts
        return task
    except ValidationError as e:
        first = e.errors()[0]
        raise fail(f"field {'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None
    except ValueError as e:
        raise fail(str(e)) from None


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
    as_json: JsonOpt = False,
) -> None:
    """Run one task and wait: prints the answer, the steps and the Temporal UI link."""
    settings = load_settings(pool)
    agents = load_pool(settings)
    task = _task(question, task_id, reference, verifier, max_steps, rounds, depth, temperature)

    async def go() -> RunResult:
        conductor = await ConductorClient.connect(settings)
        in_process = settings.embedded if worker is None else worker
        async with in_process_worker(conductor, agents, in_process):
            workflow_id = await conductor.submit(task)
            if not as_json:
                err.print(f"run [bold]{escape(workflow_id)}[/] · "
                          f"{escape(settings.workflow_url(workflow_id))}", soft_wrap=True)
            with err.status("conducting…", spinner="dots"):
                return await conductor.result(workflow_id)

    result = run_async(go())
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
    settings = load_settings()
    task = _task(question, task_id, reference, verifier, max_steps, rounds, depth, temperature)

    async def go() -> str:
        return await (await ConductorClient.connect(settings)).submit(task)

    out.print(Text(run_async(go())), highlight=False, soft_wrap=True)


@app.command()
def status(workflow_id: str) -> None:
    """Show whether a run is running, completed or failed, and its steps so far."""
    settings = load_settings()

    async def go() -> Any:
        return await (await ConductorClient.connect(settings)).status(workflow_id)

    _print_status(run_async(go()), settings)


def _print_status(st: RunStatus, settings: Settings) -> None:
    """`status`: the run's id, status and UI link, then its steps so far (RunStatus)."""
    out.print(Text.assemble(st.workflow_id, ": ", (st.status, "bold"), " · ",
                            settings.workflow_url(st.workflow_id)), soft_wrap=True)
    if st.progress is not None:
        out.print(_steps(st.progress))


@app.command()
def result(workflow_id: str, as_json: JsonOpt = False) -> None:
    """Wait for a run and print its result."""
    settings = load_settings()

    async def go() -> RunResult:
        return await (await ConductorClient.connect(settings)).result(workflow_id)

    res = run_async(go())
    if as_json:
        out.print_json(res.model_dump_json())
    else:
        _print_result(res, settings)


def _steps(res: RunResult) -> Fitted:
    rows = [row for rnd in res.rounds for row in record_rows(rnd)]
    return steps_table(rows, RUN_COLUMNS, title="steps")


def _print_result(res: RunResult, settings: Settings) -> None:
    if res.status == "completed":
        # Markdown, never Rich markup; hyperlinks=False: a link shows its target, so a model
        # cannot hide where `[click](file:///...)` goes behind a terminal hyperlink.
        out.print(Panel(Markdown(res.answer or "", hyperlinks=False), title="answer",
                        title_align="left"))
    else:
        out.print(Panel(Text(res.error or res.status), title=Text(res.status, style="red"),
                        title_align="left"))
        last = res.rounds[-1].attempts[-1] if res.rounds and res.rounds[-1].attempts else None
        if last is not None:
            out.print(Panel(Text(last.raw_text), title="conductor's last reply",
                            title_align="left"))
    out.print(_steps(res))
    if res.reward is not None:
        out.print(reward_line(res.reward))
    t = res.totals
    out.print(
        f"plans: {t.plan_calls} · agent calls: {t.agent_calls} · tokens in/out: "
        f"{t.usage.input_tokens}/{t.usage.output_tokens} · cost: ${t.cost_usd:.4f} · "
        f"{t.seconds:.1f}s"
    )
    out.print(Text(f"Temporal UI: {settings.workflow_url(res.workflow_id, res.run_id)}"),
              soft_wrap=True)
