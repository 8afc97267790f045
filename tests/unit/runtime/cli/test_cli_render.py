"""The CLI's one step table: the sees label, shortening, and escaping of model-written text."""

from __future__ import annotations

import importlib
import io
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from rich.console import Console
from rich.markup import escape
from typer.testing import CliRunner

from conductor_engine.engine.contracts.plans import Step, sees_label
from conductor_engine.engine.contracts.records import (
    PlanAttempt,
    RoundRecord,
    RunResult,
    StepRecord,
)
from conductor_engine.engine.contracts.rewards import Reward, RewardWeights
from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.contracts.training_runs import IterationStats
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.trace_store import TraceSummary
from conductor_engine.runtime.cli import app
from conductor_engine.runtime.cli import history as cli_history
from conductor_engine.runtime.cli import traces as cli_traces
from conductor_engine.runtime.cli.render import (
    record_rows,
    reward_line,
    shorten,
    steps_table,
    trail_rows,
)
from conductor_engine.runtime.client import ConductorClient, RunStatus
from conductor_engine.runtime.history import (
    AttemptError,
    Trail,
    TrailPlanAttempt,
    TrailRound,
    TrailStep,
)
from tests.paths import DATA, ROOT
from tests.traces import make_trace

# The module, not the Typer app of the same name that the package exports.
cli_app = importlib.import_module("conductor_engine.runtime.cli.app")


def _text(table: object, width: int = 200) -> str:
    console = Console(width=width, file=io.StringIO(), color_system=None, emoji=False)
    console.print(table)
    assert isinstance(console.file, io.StringIO)
    return console.file.getvalue()


def test_the_sees_label_names_steps_from_one() -> None:
    assert sees_label([]) == "none" and sees_label([0, 2]) == "1,3"
    assert sees_label([0, 1], "all") == "all" and sees_label([0, 1], [0, 1]) == "1,2"
    assert Step(agent="a", subtask="s", access="all").access_label() == "all"
    assert Step(agent="a", subtask="s", access=[2, 0, 2]).access_label() == "1,3"
    assert Step(agent="a", subtask="s", access=[]).access_label() == "none"


def test_shorten_puts_text_on_one_line_and_marks_the_cut() -> None:
    assert shorten("a\n  b", None) == "a\n  b"
    assert shorten("a\n  b", 10) == "a b"
    assert shorten("abcdefghij", 5) == "abcd…"


def test_result_and_history_say_the_same_of_what_a_step_sees(
        printed: Callable[[], str]) -> None:
    """A first step granted "all" sees no earlier step: `conductor result` once said "all" there
    while `conductor history` said "none" for the same step."""
    grants = [("all", []), ([], []), ("all", [0, 1])]
    steps = [StepRecord(round=0, index=i, agent="gpt", subtask="s", access=acc, sees=saw)
             for i, (acc, saw) in enumerate(grants)]
    trail = TrailRound(index=0, steps=[
        TrailStep(round=0, index=i, agent="gpt", subtask="s", access=acc, sees=saw)
        for i, (acc, saw) in enumerate(grants)])
    seen = [r.sees for r in record_rows(RoundRecord(index=0, steps=steps))]
    assert seen == [r.sees for r in trail_rows(trail)] == ["none", "none", "1,2"]
    cli_history._print_trail_round(trail, None)
    cli_runs._print_result(RunResult(task_id="t", workflow_id="conduct-1", run_id="r",
                                     rounds=[RoundRecord(index=0, steps=steps)]), Settings())
    text = printed()
    assert text.count("sees") == 2 and " all " not in text and "saw" not in text


def test_the_table_prints_model_text_literally() -> None:
    step = TrailStep(round=0, index=0, agent="gpt", subtask="set arr[i] to [/x]",
                     output="[red]not red", status="failed", child_workflow_id="child",
                     errors=[AttemptError(attempt=1, message="HTTP 429 [b]")])
    text = _text(steps_table(trail_rows(TrailRound(index=0, steps=[step])),
                             ("step", "subtask", "output", "attempts", "errors")))
    assert "set arr[i] to [/x]" in text and "[red]not red" in text and "#1: HTTP 429 [b]" in text
    assert "1/1" in text and "0 (self-call)" in text
    assert "tokens" not in text, "only the columns asked for"


# --- user and model text is never Rich markup; help text shows as written --------------------

HOSTILE = ["[/code]", "[bold]x", "[@SPLIT]", "[link=file:///etc/passwd]x[/link]", "ends\\",
           ":cat: :smile:"]
MARKUP = HOSTILE[:4]
CLI_MODULES = [importlib.import_module(f"conductor_engine.runtime.cli.{name}")
               for name in ("app", "runs", "stack", "pool", "batches", "traces", "resume",
                            "train", "plan", "tasks", "history")]
cli_runs, cli_batches, cli_train = CLI_MODULES[1], CLI_MODULES[4], CLI_MODULES[7]


@pytest.fixture
def printed(monkeypatch: pytest.MonkeyPatch) -> Callable[[], str]:
    """What the CLI's two consoles print, as plain text: wide, no colour, emoji codes left as
    written like the CLI's own consoles (test_the_cli_consoles_leave_emoji_codes_alone)."""
    consoles = {name: Console(width=1000, file=io.StringIO(), color_system=None, emoji=False)
                for name in ("out", "err")}
    for module in CLI_MODULES:
        for name, console in consoles.items():
            if hasattr(module, name):
                monkeypatch.setattr(module, name, console)

    def text() -> str:
        return "".join(c.file.getvalue() for c in consoles.values()  # type: ignore[attr-defined]
                       )
    return text


def test_the_cli_consoles_leave_emoji_codes_alone() -> None:
    """rich.markup.escape leaves `:cat:` alone; the consoles must too."""
    for console in (cli_app.out, cli_app.err):
        with console.capture() as captured:
            console.print(f"[bold]{escape('a:cat:b [/code]')}[/]")
        assert captured.get().strip() == "a:cat:b [/code]"


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_trace_prints_hostile_text_verbatim(hostile: str, printed: Callable[[], str]) -> None:
    trace = make_trace(f"id-{hostile}", dataset=f"ds-{hostile}", output=f"out {hostile}")
    trace = trace.model_copy(update={
        "task": trace.task.model_copy(update={"question": f"q {hostile}",
                                              "tags": [f"t{hostile}"]}),
        "error": f"err {hostile}"})
    cli_traces._print_trace(trace, limit=None)
    text = printed()
    for expected in (f"id-{hostile}", f"ds-{hostile}", f"q {hostile}", f"t{hostile}",
                     f"out {hostile}", f"err {hostile}"):
        assert expected in text, expected


@pytest.mark.parametrize("hostile", HOSTILE)
def test_traces_list_prints_hostile_text_verbatim(hostile: str) -> None:
    trace = make_trace(f"id-{hostile}", dataset=f"ds-{hostile}")
    row = TraceSummary(
        workflow_id=f"conduct-{hostile}", run_id="r", parent_workflow_id=None,
        task_id=f"id-{hostile}", dataset=f"ds-{hostile}", tags=[], policy=trace.policy,
        status="completed", reward=1.0, correct=True, input_tokens=1, output_tokens=2,
        cost_usd=0.0, seconds=1.0, finished_at=trace.finished_at, question=f"q {hostile}")
    text = _text(cli_traces.traces_table([row]), width=1000)
    for expected in (f"conduct-{hostile}", f"id-{hostile}", f"ds-{hostile}", f"q {hostile}"):
        assert expected in text, expected


def _result(hostile: str, **update: Any) -> RunResult:
    step = StepRecord(round=0, index=0, agent="gpt", subtask=f"sub {hostile}", access=[],
                      status="done", output=f"out {hostile}")
    attempt = PlanAttempt(attempt=1, raw_text=f"reply {hostile}", conductor_id="c",
                          policy_version="v1")
    return RunResult(task_id="t", workflow_id=f"conduct-{hostile}", run_id="r",
                     rounds=[RoundRecord(index=0, attempts=[attempt], steps=[step])], **update)


@pytest.mark.parametrize("hostile", HOSTILE)
def test_status_prints_hostile_text_verbatim(hostile: str, printed: Callable[[], str]) -> None:
    st = RunStatus(workflow_id=f"conduct-{hostile}", run_id=None, status="running",
                   progress=_result(hostile))
    cli_runs._print_status(st, Settings.model_construct())
    text = printed()
    assert f"conduct-{hostile}: running" in text and f"sub {hostile}" in text


@pytest.mark.parametrize("hostile", MARKUP)
def test_a_result_prints_hostile_text_verbatim(hostile: str, printed: Callable[[], str]) -> None:
    """The answer is Markdown (a model's answer is), but never Rich markup, and a link shows
    where it goes; a failed run's error and the conductor's reply print as written."""
    answer = f"a {hostile} see [here](https://evil.example/x)"
    cli_runs._print_result(_result(hostile, answer=answer), Settings.model_construct())
    text = printed()
    assert f"a {hostile}" in text and "https://evil.example/x" in text
    assert f"sub {hostile}" in text
    failed = _result(hostile, status="failed", error=f"boom {hostile}")
    cli_runs._print_result(failed, Settings.model_construct())
    assert f"boom {hostile}" in printed() and f"reply {hostile}" in printed()


@pytest.mark.parametrize("hostile", HOSTILE)
def test_history_prints_hostile_text_verbatim(hostile: str, printed: Callable[[], str]) -> None:
    step = TrailStep(round=0, index=0, agent="gpt", subtask=f"sub {hostile}", status="failed",
                     output=f"out {hostile}",
                     errors=[AttemptError(attempt=1, message=f"HTTP 429 {hostile}")])
    attempt = TrailPlanAttempt(round=0, attempt=1, status="done", error=f"bad plan {hostile}",
                               errors=[AttemptError(attempt=1, message=f"retry {hostile}")])
    trail = Trail(workflow_id=f"conduct-{hostile}", run_id="r", status="failed",
                  task=Task(id=f"id-{hostile}", question=f"q {hostile}"), error=f"err {hostile}",
                  rounds=[TrailRound(index=0, plan_attempts=[attempt], steps=[step])])
    cli_history._print_trail(trail, limit=None)
    text = printed()
    for expected in (f"conduct-{hostile}", f"id-{hostile}", f"q {hostile}", f"sub {hostile}",
                     f"out {hostile}", f"HTTP 429 {hostile}", f"bad plan {hostile}",
                     f"retry {hostile}", f"err {hostile}"):
        assert expected in text, expected


@pytest.mark.parametrize("hostile", [*HOSTILE, "*x* `y` <b>z</b> [t](https://e.x)"])
def test_a_batch_summary_and_a_training_table_print_the_name_verbatim(hostile: str) -> None:
    summary = {"batch": f"b {hostile}", "tasks": 1, "by_status": {"completed": 1},
               "accuracy": 1.0, "with_reference": 1, "mean_reward": 1.0, "input_tokens": 1,
               "output_tokens": 2, "cost_usd": 0.0, "run_seconds": {},
               "agents": {"gpt-5": {"calls": 1, "input_tokens": 1, "output_tokens": 1,
                                    "cost_usd": 0.0, "seconds": {}}}}
    assert f"Batch b {hostile}" in _text(cli_batches.batch_summary(summary), width=1000)
    table = cli_train.history_table(f"run {hostile}", [IterationStats(
        iteration=1, version=f"v1 {hostile}", note=f"n {hostile}")])
    text = _text(table, width=1000)
    assert f"run {hostile}" in text and f"v1 {hostile}" in text


def test_pool_show_and_tasks_check_print_hostile_text_verbatim(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no conductor.toml of the working directory
    pool = tmp_path / "[@SPLIT] pool.toml"
    pool.write_text('[conductor]\nid = "c"\nprovider = "local"\n'
                    'model = "smollm2-135m-instruct"\n'
                    'description = "[/code] [bold]x [link=file:///etc/passwd]x[/link] :cat:"\n'
                    '[[agents]]\nid = "a"\nprovider = "sim"\nmodel = "sim"\n'
                    'description = "[@SPLIT]"\n')
    runner = CliRunner()
    shown = runner.invoke(app, ["pool", "show", "--pool", str(pool)], env={"COLUMNS": "400"})
    assert shown.exit_code == 0, shown.output
    assert "[/code] [bold]x [link=file:///etc/passwd]x[/link] :cat:" in shown.output
    assert "[@SPLIT] pool.toml" in shown.output and "[@SPLIT]  " in shown.output
    tasks = tmp_path / "[bold]tasks.jsonl"
    tasks.write_text('{"question": "[/code] :cat:"}\n'
                     '{"question": "q", "verifier": "[link=file:///etc/passwd]x[/link]"}\n')
    checked = runner.invoke(app, ["tasks", "check", str(tasks), "--json"],
                            env={"COLUMNS": "400"})
    assert checked.exit_code == 1
    assert json.loads(checked.stdout.splitlines()[0])["question"] == "[/code] :cat:"
    assert (f"{tasks}:2: field verifier: unknown '[link=file:///etc/passwd]x[/link]'"
            in checked.stderr)


def test_an_error_line_and_a_reward_line_print_hostile_text_verbatim(
        printed: Callable[[], str]) -> None:
    for hostile in HOSTILE:
        cli_app.fail(f"no trace of {hostile}")
        assert f"error: no trace of {hostile}" in printed()
        reward = Reward(value=0.5, reason=f"wrong {hostile}", weights=RewardWeights())
        assert f"reward: 0.5 (wrong {hostile})" in _text(reward_line(reward), width=1000)


def test_brackets_in_help_text_show() -> None:
    runner = CliRunner()
    check = runner.invoke(app, ["tasks", "check", "--help"], terminal_width=200)
    assert "hf:NAME[:CONFIG][@SPLIT]" in check.output
    train = runner.invoke(app, ["train", "start", "--help"], terminal_width=200)
    assert "[policy], [loss], [rollouts]" in train.output


# --- a task file with a bad line submits nothing ----------------------------------------------


@pytest.mark.parametrize("command", [["batch"], ["train", "start"]])
def test_a_task_file_with_a_bad_line_submits_nothing(
        command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)

    async def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("connected to Temporal: something would have been submitted")

    monkeypatch.setattr(ConductorClient, "connect", never)
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"question": "fine"}\n{"question": "q", "tags": ["\\u0000"]}\n'
                    '{"question": "fine too"}\n{oops\n')
    result = CliRunner().invoke(app, [*command, str(path)], env={"COLUMNS": "400"})
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"{path}:2: field tags.0: holds a NUL character")
    assert lines[1].startswith(f"{path}:4: invalid JSON")
    assert lines[2].startswith(f"error: 2 bad line(s) in {path} (2 valid): nothing was "
                               "submitted")
    assert "--json > valid.jsonl" in lines[2] and len(lines) == 3


class _Connected(Exception):
    """Raised where `conductor eval` would connect: it got past loading its tasks."""


@pytest.mark.parametrize("strict", [False, True], ids=["bad-rows-listed-rest-run", "strict"])
def test_eval_lists_a_benchmark_s_bad_rows_and_runs_the_rest_unless_strict(
        strict: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)

    async def connect(*args: Any, **kwargs: Any) -> None:
        raise _Connected

    monkeypatch.setattr(ConductorClient, "connect", connect)
    rows = DATA / "shapes" / "mmlu.jsonl"
    pool = ROOT / "examples" / "sim" / "pool.toml"
    args = ["eval", f"mmlu:{rows}", "--name", "e", "--pool", str(pool), "--baselines", "none"]
    result = CliRunner().invoke(app, [*args, *(["--strict"] if strict else [])],
                                env={"COLUMNS": "400"})
    lines = result.stderr.splitlines()
    assert lines[0] == f"mmlu:{rows}:3: answer 7 is not a letter or index of the 2 choices"
    if strict:
        assert result.exit_code == 1 and "nothing was submitted" in lines[1], result.output
    else:
        assert isinstance(result.exception, _Connected), result.output
        assert lines[1] == (f"warning: 1 bad line(s) in mmlu:{rows} left out; 2 valid task(s) "
                            "run (--strict refuses instead)")


# --- every numeric flag has a range ----------------------------------------------------------

def _numeric_params(command: Any, path: str = "conductor") -> Iterator[tuple[str, Any]]:
    for name, sub in getattr(command, "commands", {}).items():
        yield from _numeric_params(sub, f"{path} {name}")
    for param in getattr(command, "params", []):
        descriptor = getattr(param, "type_descriptor", None)
        annotation = getattr(descriptor, "annotation", None)
        if isinstance(annotation, type) and issubclass(annotation, int | float) \
                and annotation is not bool:
            yield f"{path} {param.name}", param


def test_every_numeric_option_and_argument_has_a_range() -> None:
    params = dict(_numeric_params(typer.main.get_command(app)))
    assert "conductor traces list limit" in params and "conductor run temperature" in params
    assert "conductor plan check pool_size" in params, "optional ones (int | None) too"
    unbounded = [name for name, p in params.items() if p.min is None or p.max is None]
    assert unbounded == [], "give each numeric option typer's min= and max="


@pytest.mark.parametrize("args", [
    ["traces", "list", "--limit", "-1"],
    ["traces", "list", "--limit", "100001"],
    ["traces", "list", "--min-reward", "inf"],
    ["run", "q", "--max-steps", "21"],
    ["run", "q", "--temperature", "nan"],
    ["train", "start", "--lr", "0"],
    ["train", "start", "x.jsonl", "--seed", "-1"],
    ["batch", "x.jsonl", "--concurrency", "0"],
    ["plan", "check", "--pool-size", "0"],
])
def test_an_out_of_range_flag_is_a_usage_error_before_anything_runs(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Invalid value for" in result.output and "Traceback" not in result.output


@pytest.fixture
def far_east() -> Iterator[None]:
    """Local time 9 hours ahead of UTC, so midnight on 1 January of year 1 has no UTC time."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "Asia/Tokyo"
    time.tzset()
    yield
    if before is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = before
    time.tzset()


def test_a_date_with_no_utc_time_is_a_usage_error(far_east: None) -> None:
    result = CliRunner().invoke(app, ["traces", "list", "--since", "0001-01-01"])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--since'" in result.output and "out of range" in result.output


def test_pool_show_stays_whole_at_80_columns_and_lists_json(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from conductor_engine.engine.providers.pool import Pool
    from conductor_engine.runtime.cli.pool import _listing, _source
    from tests.cli import assert_fits

    monkeypatch.chdir(tmp_path)
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    listing = _listing(Pool.load())
    cells = ["pool:", "default", "id", "provider", "model", "key variable", "usable", "$/M in",
             "$/M out", "price source", "web search", "description", "(conductor)",
             "no (key not set)", "yes", "-", "?", "(tiered)", "+", "pool file", "genai-prices",
             "local", "unknown"]
    for a in listing:
        cells += [a.id, a.provider, a.model, a.key_variable or "", a.description,
                  f"{a.prices.input.per_mtok:g}", f"{a.prices.output.per_mtok:g}",
                  _source(a.prices)]
    cells = [f"{c}:" for c in cells] + cells  # the narrow layout's `header: value` lines
    for width in (80, 100, 150, 250):
        shown = CliRunner().invoke(app, ["pool", "show"], env={"COLUMNS": str(width)})
        assert shown.exit_code == 0, shown.output
        assert_fits(shown.stdout, width, cells)
        assert "gpt-5" in shown.stdout and "step-by-step" in shown.stdout
    listed = CliRunner().invoke(app, ["pool", "show", "--json"], env={"COLUMNS": "80"})
    rows = {r["id"]: r for r in json.loads(listed.stdout)}
    assert set(rows) == {"conductor", "gpt-5", "claude-sonnet-4", "gemini-2.5-pro", "smollm2"}
    gpt = rows["gpt-5"]
    assert gpt["role"] == "agent" and gpt["provider"] == "openai" and gpt["usable"] is False
    assert gpt["key_variable"] == "OPENAI_API_KEY"
    assert gpt["prices"]["input"] == {"per_mtok": 1.25, "source": "genai-prices"}
    assert gpt["capabilities"]["structured_output"] is True
    assert rows["conductor"]["role"] == "conductor"
    assert rows["smollm2"]["prices"]["output"] == {"per_mtok": 0.0, "source": "local"}


def test_the_eval_table_stays_whole_at_80_columns() -> None:
    from conductor_engine.engine.eval.report import (
        HEADER,
        NARROW_HEADER,
        SystemRow,
        cells,
        narrow_cells,
    )
    from conductor_engine.runtime.cli.render import column_widths, fitted_table
    from tests.cli import assert_fits

    rows = [SystemRow(system=s, tasks=50, accuracy=0.52, mean_reward=0.76,
                      input_tokens_per_task=12345.0, output_tokens_per_task=678.0,
                      tokens_per_task=13023.0, cost_per_task=0.01234, p50_s=3.2, p95_s=11.5,
                      calls_per_task=4.5, delta_to_best_single=0.04, untrusted=12)
            for s in ("conductor r0", "single claude-sonnet-4", "best single (claude-sonnet-4)",
                      "moa", "random", "chain")]
    table = [cells(r) for r in rows]
    narrow = [narrow_cells(r) for r in rows]
    assert column_widths(HEADER, table, 80) is None, "80 columns take the narrow table"
    assert column_widths(NARROW_HEADER, narrow, 80) is not None, "which fits as a table"
    words = [*HEADER, *NARROW_HEADER, "eval", "e1:", "50", "tasks",
             *(c for row in [*table, *narrow] for c in row)]
    for width in (80, 120, 200):
        header, cells_ = (HEADER, table) if width > 80 else (NARROW_HEADER, narrow)
        text = "".join(_text(part, width) for part in
                       fitted_table("eval e1: 50 tasks", header, cells_, width))
        assert_fits(text, width, [*words, *(f"{w}:" for w in words)])
        assert "(claude-sonnet-4)" in text and "+0.040" in text
        assert "untrusted" in text and "12" in text, "forgeable verdicts are counted apart"


# --- every table and the progress bar readable at 80 columns -----------------------------------

WIDTHS = (80, 120)


def _printed_at(width: int, *renderables: Any) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None,
                      emoji=False)
    for r in renderables:
        console.print(r)
    return console.export_text()


def _long_step(i: int, status: str = "done") -> StepRecord:
    return StepRecord(round=0, index=i, agent="claude-sonnet-4", access="all",
                      subtask="Check each intermediate result of the previous step carefully "
                              "and report any arithmetic mistakes you find.",
                      sees=list(range(i)), status=status, output="The products 17 x 23 = 391 "
                      "and 391 / 17 = 23 agree, so the answer stands.", model="m",
                      seconds=12.25, attempts=3, cost_usd=0.01234)


@pytest.mark.parametrize("width", WIDTHS)
def test_run_trace_and_history_step_tables_split_no_word(width: int) -> None:
    from tests.cli import assert_fits

    rnd = RoundRecord(index=0, steps=[_long_step(i) for i in range(3)])
    trail = TrailRound(index=0, steps=[TrailStep(
        round=0, index=s.index, agent=s.agent, subtask=s.subtask, access=s.access, sees=s.sees,
        status="done", output=s.output, attempts=s.attempts, cost_usd=s.cost_usd,
        errors=[AttemptError(attempt=1, message="HTTP 429 rate limited, retried")])
        for s in rnd.steps])
    tables = [(steps_table(record_rows(rnd), cli_runs.RUN_COLUMNS, title="steps"),
               cli_runs.RUN_COLUMNS),
              (steps_table(record_rows(rnd), cli_traces.TRACE_COLUMNS, limit=300),
               cli_traces.TRACE_COLUMNS),
              (steps_table(trail_rows(trail), cli_history.TRAIL_COLUMNS, limit=300),
               cli_history.TRAIL_COLUMNS)]
    for table, columns in tables:
        text = _printed_at(width, table)
        rows = table.rows
        words = [*table.headers, *(f"{h}:" for h in table.headers), "steps",
                 *(c for row in rows for c in row)]
        assert_fits(text, width, words)
        assert "claude-sonnet-4" in text and "arithmetic" in text and "1,2" in text
        if width == 120 and columns == cli_runs.RUN_COLUMNS:
            assert "tokens in/out" in text and "attempts" in text, "all of it where it fits"


@pytest.mark.parametrize("width", WIDTHS)
def test_traces_list_and_the_training_table_split_no_word(width: int) -> None:
    from datetime import UTC, datetime

    from tests.cli import assert_fits

    summary = TraceSummary(
        workflow_id="batch-gpqa-diamond/gpqa-0042", run_id="r", task_id="gpqa-0042",
        parent_workflow_id=None, tags=[], correct=False,
        dataset="gpqa-diamond", policy={"name": "conductor", "version": "v12"},
        status="completed", reward=0.5, input_tokens=12345, output_tokens=678, cost_usd=0.0123,
        seconds=41.5, finished_at=datetime(2026, 11, 28, 10, 0, tzinfo=UTC),
        question="Which reagent turns a primary alcohol into an aldehyde?")
    listing = cli_traces.traces_table([summary, summary])
    stats = IterationStats(iteration=12, version="v12", rollouts=64, mean_reward=0.734,
                           valid_plan_rate=0.98, loss=-0.0123, clip_fraction=0.05, kl=0.0012,
                           grad_norm=1.25, tokens=1234567, published="v13",
                           left_out={"verifier_error": 4, "step_failed": 1})
    training = cli_train.history_table("pool7 · running · sampling", [stats, stats])
    for table in (listing, training):
        text = _printed_at(width, table)
        words = [*table.headers, *(f"{h}:" for h in table.headers), "trace(s)",
                 *str(table.title).split(), *(c for row in table.rows for c in row)]
        assert_fits(text, width, words)
    text = _printed_at(width, listing)
    assert "batch-gpqa-diamond/gpqa-0042" in text and "completed" in text and "0.5" in text
    assert "aldehyde" in text
    assert "0.734" in _printed_at(width, training)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_batch_bar_keeps_its_count_and_time_whole(width: int) -> None:
    from rich.progress import Progress

    from conductor_engine.engine.contracts.batches import BatchProgress

    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    bar = Progress(*cli_batches.progress_columns(), console=console, expand=True)
    p = BatchProgress(total=1200, completed=342, running=4, failed=2, skipped=1, scored=2,
                      reward_sum=1.0, input_tokens=1_234_567, output_tokens=89_000,
                      cost_usd=1.2345)
    bar.add_task("gpqa-diamond-with-a-long-batch-name", total=p.total, completed=p.done,
                 info=cli_batches.progress_info(p))
    console.print(bar.make_tasks_table(bar.tasks))
    [line] = console.export_text().splitlines()
    assert len(line) <= width and "345/1200" in line and "0:00:00" in line
    assert "failed 2" in line and "reward 0.500" in line
    if width >= 120:
        assert "running 4" in line and "1,323,567" in line


def test_a_reward_prints_as_its_number_and_verdict_and_its_line_states_the_rule() -> None:
    wrong = Reward(value=0.5, reason="wrong: expected 391, got 381")
    assert str(wrong) == f"{wrong}" == "0.5 (wrong: expected 391, got 381)"
    assert float(wrong) == 0.5 and Reward.model_validate_json(wrong.model_dump_json()) == wrong
    assert str(Reward(value=None, reason="no reference answer")) == "none (no reference answer)"
    with pytest.raises(ValueError, match="no reference answer"):
        float(Reward(value=None, reason="no reference answer"))
    line = _text(reward_line(wrong))
    assert line.strip() == ("reward: 0.5 (wrong: expected 391, got 381) · rule: 1 right · "
                            "0.5 wrong · 0 no valid plan")
    custom = RewardWeights(wrong=0.2, failed=-1.0, cost_penalty_per_usd=2.0)
    assert custom.rule() == "1 right · 0.2 wrong · 0 no valid plan · -1 failed run · -2 per $"


def test_the_warm_up_line_shows_its_rehearsal_first_and_how_it_ranked() -> None:
    """`train status`'s warm-up: the rehearsal's runs and seconds on a line before it, the
    ranking by plan mean and the selected shapes in it; no rehearsal line without one."""
    from conductor_engine.engine.contracts.training import Rehearsal, WarmupResult
    from conductor_engine.runtime.cli.train import warmup_line

    w = WarmupResult(name="c", version=1, published=True, tasks=24, tasks_with_plans=24,
                     plans=24, conductors={"c": 24}, mean_reward=0.93, rank="plan_mean",
                     ranked_plans=109, counted_runs=624, mean_plan_reward=0.74,
                     shapes={"1 step": 20, "2 steps (sees)": 4},
                     rehearsal=Rehearsal(tasks=24, plans=54, runs=430, mean_reward=0.63,
                                         left_out={"step_failed": 2}, seconds=151.2))
    first, second = warmup_line(w).split("\n")
    assert first == ("rehearsal · 54 candidate plans of 24 training tasks · 430 runs · their "
                     "reward 0.630 · left out 2 (step_failed 2) · 151.2s")
    assert "ranked by plan mean: 109 plans over 624 runs, the chosen plans' mean 0.740" in second
    assert "shapes 24 (1 step 20, 2 steps (sees) 4)" in second
    plain = w.model_copy(update={"rehearsal": None, "rank": "run"})
    assert "\n" not in warmup_line(plain) and "ranked" not in warmup_line(plain)
