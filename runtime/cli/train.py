"""`conductor train start|status|stop` and `conductor trainer`: GRPO training from the CLI.

Importing this module registers them on the main app. Nothing here imports torch: the trainer
service is imported only by `conductor trainer` (and by `train start` when it serves the trainer
itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tomllib
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from pydantic import ValidationError
from rich.markup import escape
from rich.text import Text

from conductor_engine.engine.contracts.limits import MAX_CONCURRENCY
from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.contracts.training import Recipe, WarmupResult
from conductor_engine.engine.rewards.rollouts import describe_counts
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.toml_errors import not_utf8, toml_error, utf8_text
from conductor_engine.engine.training import TrainingOptions, plan_training
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
from conductor_engine.runtime.cli.render import Fitted
from conductor_engine.runtime.client import ConductorClient
from conductor_engine.runtime.logging import announce_json

if TYPE_CHECKING:
    from conductor_engine.engine.storage.policies import PolicyVersion
    from conductor_engine.engine.storage.retention import Pruning
    from conductor_engine.workflows.train import HeldOutEval, IterationStats, TrainProgress

T = TypeVar("T")

MAX_ITERATIONS = 1_000_000
"""A bound that only refuses nonsense: a training run this long continues as new anyway."""
MIN_LR = 1e-12
"""The learning rate must be above 0 (LossConfig: gt=0); typer bounds are closed, so this is
the smallest accepted."""

train_app = typer.Typer(help="Train the conductor with GRPO on its own traces.",
                        no_args_is_help=True, rich_markup_mode=None)
app.add_typer(train_app, name="train")


def _recipe(path: Path | None) -> Recipe:
    if path is None:
        return Recipe()
    try:
        return Recipe.model_validate(tomllib.loads(utf8_text(path.read_bytes())))
    except OSError as e:
        raise fail(f"recipe {path}: cannot read it: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise fail(f"recipe {not_utf8(path, e)}") from None
    except tomllib.TOMLDecodeError as e:
        raise fail(f"recipe {toml_error(path, e)}") from None
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "top level"
        more = f" ({e.error_count()} problems in all)" if e.error_count() > 1 else ""
        raise fail(f"recipe {path}: field {where}: {first['msg']}{more}") from None


@contextlib.asynccontextmanager
async def _in_process_trainer(conductor: ConductorClient, enabled: bool) -> AsyncIterator[None]:
    if not enabled:
        yield
        return
    from conductor_engine.trainer.service import build_trainer_worker

    async with build_trainer_worker(conductor.client, conductor.settings):
        yield


@train_app.command("start")
def train_start(
    tasks: Annotated[str | None, typer.Argument(
        help="JSONL task file (or hf:NAME, SHAPE:SOURCE) to sample rollouts from, or a "
             "training mix manifest (.toml: examples/paper/train_mix.toml)")] = None,
    name: Annotated[str | None, typer.Option(help="training run name (default: file stem)")] = None,
    recipe: Annotated[Path | None, typer.Option(
        help="TOML recipe: [policy], [loss], [rollouts], [heldout], [checkpoints], [warmup]; "
        "fields in docs/reference/recipe.md")] = None,
    iterations: Annotated[int, typer.Option(
        help="updates to run", min=1, max=MAX_ITERATIONS)] = 20,
    group_size: Annotated[int | None, typer.Option(
        help="G: rollouts per task", min=2, max=MAX_CONCURRENCY)] = None,
    tasks_per_iteration: Annotated[int | None, typer.Option(
        help="tasks per update", min=1, max=MAX_CONCURRENCY)] = None,
    learning_rate: Annotated[float | None, typer.Option(
        "--lr", help="learning rate", min=MIN_LR, max=1.0)] = None,
    base: Annotated[str | None, typer.Option(
        help="the model the conductor serves (only for an openai-compatible conductor)")] = None,
    from_traces: Annotated[bool, typer.Option(
        help="no rollouts: train on the complete groups already stored")] = False,
    concurrency: Annotated[int, typer.Option(
        min=1, max=MAX_CONCURRENCY,
        help=f"rollouts in flight at once, at most {MAX_CONCURRENCY}: each is a child "
             "workflow, and Temporal allows a workflow 2,000 pending children "
             "(limit.numPendingChildExecutions.error); an iteration's G × tasks rollouts "
             "wait their turn")] = 64,
    seed: Annotated[int, typer.Option(help="shuffles the task order (the tags taking turns)", min=0,
                                      max=2**63 - 1)] = 0,
    holdout: Annotated[float | None, typer.Option(
        min=0.0, max=0.9, help="share of each tag's tasks held out of training and evaluated "
        "greedily as it goes (recipe [heldout] fraction; 0 = none)")] = None,
    eval_every: Annotated[int | None, typer.Option(
        min=1, max=MAX_ITERATIONS, help="evaluate the held-out tasks after every K-th "
        "iteration (recipe [heldout] every)")] = None,
    pool: PoolOpt = None,
    worker: Annotated[bool | None, typer.Option(
        help="serve rollouts and the trainer from this process (default: yes on the embedded "
             "stack)")] = None,
    watch: Annotated[bool, typer.Option(help="show progress until it ends")] = True,
) -> None:
    """Start (or resume) training run NAME: each iteration samples G rollouts per task with
    the current version, trains on them, publishes the next version. `conductor train start
    --from-traces --name NAME` trains on stored groups instead. Starting a stopped run's NAME
    again resumes it."""
    settings = load_settings(pool)
    agents = load_pool(settings)
    if tasks is None and not from_traces:
        raise fail("give a task file to sample rollouts from, or --from-traces")
    opts = TrainingOptions(
        name=name or (Path(tasks.split(":")[-1]).stem if tasks else agents.conductor.id),
        recipe=_recipe(recipe), recipe_given=recipe is not None, base=base,
        iterations=iterations, group_size=group_size, tasks_per_iteration=tasks_per_iteration,
        learning_rate=learning_rate, from_traces=from_traces, concurrency=concurrency,
        holdout=holdout, eval_every=eval_every, seed=seed)
    try:
        plan = plan_training(opts, agents, _training_tasks(tasks) if tasks is not None else [])
    except ValueError as e:
        raise fail(str(e)) from None

    async def go() -> None:
        from conductor_engine.engine.storage.policies import PolicyRegistry

        conductor = await ConductorClient.connect(settings)
        async with open_trace_store(settings) as store:
            inp, resumed = await conductor.training_input(plan, agents,
                                                          PolicyRegistry(store.pool))
        if resumed is not None:
            err.print(Text(f"resuming {opts.name} after iteration {resumed}"))
        r, heldout = plan.recipe, plan.heldout
        in_process = settings.embedded if worker is None else worker
        async with (in_process_worker(conductor, agents, in_process),
                    _in_process_trainer(conductor, in_process)):
            wid, started = await conductor.start_training(inp)
            err.print(f"training [bold]{escape(opts.name)}[/] "
                      f"{'started' if started else 'already running'}"
                      f" from {escape(agents.conductor.id)} v{inp.progress.version}: "
                      f"{len(plan.tasks)} tasks, "
                      f"{r.rollouts.groups_per_update} per iteration × G={r.rollouts.group_size}"
                      f"{f', {len(heldout)} held out' if heldout else ''} "
                      f"· {escape(settings.workflow_url(wid))}", soft_wrap=True)
            if "tensorboard" in r.report_to:  # written by the trainer, on its machine
                where = "" if in_process else " on the trainer's machine"
                err.print(Text(f"TensorBoard: tensorboard --logdir "
                               f"{settings.data_dir / 'runs'}{where}"), soft_wrap=True)
            if watch or in_process:
                await _watch(conductor, opts.name)

    run_async(go())


async def _watch(conductor: ConductorClient, name: str) -> None:
    """One line per finished iteration until the run ends; Ctrl-C leaves it running."""
    shown = evals = warmed = 0
    while True:
        status, p = await conductor.training_progress(name)
        if p is not None:
            for w in warmup_rounds(p)[warmed:]:
                out.print(Text(warmup_line(w)), highlight=False, soft_wrap=True)
            warmed = len(warmup_rounds(p))
            for s in p.history[shown:]:
                out.print(Text(_iteration_line(s)), highlight=False, soft_wrap=True)
            shown = len(p.history)
            for e in p.evals[evals:]:
                out.print(Text(heldout_line(e)), highlight=False, soft_wrap=True)
            evals = len(p.evals)
        if status not in ("running", "continued_as_new"):
            break
        await asyncio.sleep(1.0)
    if status != "completed":
        raise LookupError(f"training run {name} ended {status}; see `conductor train status "
                          f"{name}` and the Temporal UI")
    if p is not None:
        err.print(Text(f"{name}: {p.phase} after {p.iteration} iterations at {p.label}"))


def _fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _iteration_line(s: IterationStats) -> str:
    made = f" → {s.published}" if s.published else f" (no update: {s.note})" if s.note else ""
    return (f"it {s.iteration:>3} · {s.version}{made} · {s.rollouts} rollouts"
            f"{left_out_note(s)} · reward {_fmt(s.mean_reward)} · "
            f"valid {_fmt(s.valid_plan_rate, 2)} · loss {_fmt(s.loss, 4)} · clip "
            f"{_fmt(s.clip_fraction, 3)} · kl {_fmt(s.kl, 4)} · |g| {_fmt(s.grad_norm, 3)} · "
            f"{s.tokens:,} tok · {s.rollout_seconds + s.update_seconds:.1f}s")


def warmup_rounds(p: TrainProgress) -> list[WarmupResult]:
    """Every warm-up round done so far (progress recorded before rounds has only p.warmup)."""
    return p.warmup_rounds or ([p.warmup] if p.warmup is not None else [])


def sampling_line(w: WarmupResult) -> str | None:
    """A warm-up round's exploring samples (WarmupResult.sampling), if it took some."""
    s = w.sampling
    if s is None:
        return None
    left = f" · left out {describe_counts(s.left_out)}" if s.left_out else ""
    agents = f", {s.forced_agents} of a forced agent" if s.forced_agents else ""
    return (f"warm-up samples · {s.runs} runs ({s.forced} of a forced shape{agents}) · their "
            f"reward {_fmt(s.mean_reward)}{left} · {s.tokens:,} tok · {s.seconds:.1f}s")


def rehearsal_line(w: WarmupResult) -> str | None:
    """The rehearsal before the warm-up (WarmupResult.rehearsal), if there was one."""
    r = w.rehearsal
    if r is None:
        return None
    left = f" · left out {describe_counts(r.left_out)}" if r.left_out else ""
    return (f"rehearsal · {r.plans} candidate plans of {r.tasks} training tasks · {r.runs} "
            f"runs · their reward {_fmt(r.mean_reward)}{left} · {r.seconds:.1f}s")


def warmup_line(w: WarmupResult) -> str:
    """The warm-up (WarmupResult; one round of it): what it trained on, how far it moved the
    selected plans' log-prob, and its compute; or why it published nothing. With the round's
    samples' and rehearsal's lines first when it had them."""
    before = "".join(f"{line}\n" for line in (sampling_line(w), rehearsal_line(w)) if line)
    before += "warm-up" + (f" round {w.round + 1}" if w.round else "")
    if not w.published:
        return f"{before} · nothing published: {w.reason}"
    by = ", ".join(f"{k} {v}" for k, v in w.conductors.items())
    ranked = (f" · ranked by plan mean: {w.ranked_plans} plans over {w.counted_runs} runs, "
              f"the chosen plans' mean {_fmt(w.mean_plan_reward)}" if w.rank == "plan_mean"
              else "")
    shapes = f" · shapes {describe_counts(w.shapes)}" if w.shapes else ""
    left = f" · left out {describe_counts(w.left_out)}" if w.left_out else ""
    step = w.step
    compute = (f" · {step.steps} steps, {step.tokens:,} trained tokens, "
               f"{step.passed_tokens:,} tokens passed, {step.seconds:.1f}s training"
               if step else "")
    return (f"{before} · → v{w.version} · {w.plans} plans of {w.tasks_with_plans}/"
            f"{w.tasks} training tasks ({by}) · their reward {_fmt(w.mean_reward)}{ranked}"
            f"{shapes} · log-prob per token {_fmt(w.logprob_before)} → "
            f"{_fmt(w.logprob_after)}{left}{compute} · {w.seconds:.1f}s")


def heldout_line(e: HeldOutEval) -> str:
    """One held-out evaluation (HeldOutEval): the curve users watch."""
    left = f" · left out {describe_counts(e.left_out)}" if e.left_out else ""
    return (f"held out · {e.version} after {e.iteration} iterations · {e.runs} tasks · "
            f"accuracy {_fmt(e.accuracy)} · reward {_fmt(e.mean_reward)} · valid "
            f"{_fmt(e.valid_plan_rate, 2)}{left}")


def left_out_note(s: IterationStats) -> str:
    """" · left out 5 (verifier_error 4, step_failed 1)", and what the update left out when
    that differs (stale groups, unreadable traces); "" when nothing was."""
    note = f" · left out {describe_counts(s.left_out)}" if s.left_out else ""
    if s.update_left_out and s.update_left_out != s.left_out:
        note += f" · update left out {describe_counts(s.update_left_out)}"
    return note


@train_app.command("status")
def train_status(
    name: Annotated[str, typer.Argument(help="the training run")],
    plot: Annotated[Path | None, typer.Option(
        help="where to write the reward curve PNG (default: train-NAME.png)")] = None,
    pool: PoolOpt = None,
) -> None:
    """The run's iterations, its reward curve in the terminal, and the curve as a PNG."""
    settings = load_settings(pool)

    async def go() -> tuple[str, TrainProgress | None]:
        conductor = await ConductorClient.connect(settings, start_embedded=False)
        return await conductor.training_progress(name)

    status, p = run_async(go())
    if p is None:
        raise fail(f"training run {name} is {status} but no worker answered its progress "
                    f"query; start a worker (`conductor worker`)")
    out.print(history_table(f"{name} · {status} · {p.phase}", p.history))
    for w in warmup_rounds(p):
        out.print(Text(warmup_line(w)), highlight=False, soft_wrap=True)
    for s in p.history:
        if s.update_left_out and s.update_left_out != s.left_out:
            out.print(Text(f"it {s.iteration}: the update left out "
                           f"{describe_counts(s.update_left_out)}"), highlight=False)
    for e in p.evals:  # accuracy on the held-out tasks, the curve to watch
        out.print(Text(heldout_line(e)), highlight=False, soft_wrap=True)
    curve = [(s.iteration, s.mean_reward) for s in p.history if s.mean_reward is not None]
    if not curve:
        return
    _terminal_curve(name, curve)
    _png_curve(name, curve, plot or Path(f"train-{name}.png"))


HISTORY_HEADERS = ("it", "version", "rollouts", "left out", "reward", "valid", "loss", "clip",
                   "kl", "grad norm", "tokens", "published")
HISTORY_DROP = ("tokens", "clip", "kl", "grad norm", "published", "loss", "version")
"""What a narrow terminal leaves out of the iteration table first: the reward, the valid-plan
rate and the runs left out of their groups stay."""


def history_table(title: str, history: list[IterationStats]) -> Fitted:
    """One row per iteration (IterationStats): its rollouts and the runs left out of their
    groups, by reason, then how the policy did and what the update did; fitted to the
    terminal (render.Fitted)."""
    rows = [[str(s.iteration), s.version, str(s.rollouts), describe_counts(s.left_out),
             _fmt(s.mean_reward), _fmt(s.valid_plan_rate, 2), _fmt(s.loss, 4),
             _fmt(s.clip_fraction), _fmt(s.kl, 4), _fmt(s.grad_norm), f"{s.tokens:,}",
             s.published or "—"] for s in history]
    return Fitted(title, HISTORY_HEADERS, rows, drop=HISTORY_DROP, text=("left out",))


def _terminal_curve(name: str, curve: list[tuple[int, float]]) -> None:
    try:
        import plotext as plt
    except ImportError:
        err.print(Text("(install the train extra, pip install -e '.[train]', for the reward "
                       "curve)"))
        return
    plt.clear_figure()
    plt.plot([i for i, _ in curve], [r for _, r in curve], marker="braille")
    plt.title(f"{name}: mean reward of fresh rollouts")
    plt.xlabel("iteration")
    plt.ylim(0, 1)
    plt.plotsize(min(100, out.width), 18)
    plt.show()


def _png_curve(name: str, curve: list[tuple[int, float]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        err.print(Text("(install the train extra, pip install -e '.[train]', for the PNG "
                       "plot)"))
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([i for i, _ in curve], [r for _, r in curve], marker="o")
    ax.set(title=f"{name}: mean reward of fresh rollouts", xlabel="iteration",
           ylabel="mean reward", ylim=(0, 1.05))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    err.print(Text(f"reward curve: {path}"))


@train_app.command("stop")
def train_stop(name: Annotated[str, typer.Argument(help="the training run")],
               pool: PoolOpt = None) -> None:
    """Stop after the iteration in flight; `train start --name NAME` resumes."""
    settings = load_settings(pool)

    async def go() -> None:
        conductor = await ConductorClient.connect(settings, start_embedded=False)
        await conductor.stop_training(name)

    run_async(go())
    err.print(Text(f"{name} stops after the iteration in flight; resume with `conductor train "
                   f"start TASKS --name {name}`"))


@app.command()
def trainer() -> None:
    """Run the trainer service: a worker on the `trainer` task queue that runs GRPO updates
    (on the GPU when there is one) and publishes each new policy version. On several GPUs:
    `torchrun --nproc-per-node N --no-python conductor trainer` (rank 0 polls; the others
    follow it, see trainer/distributed.py)."""
    if int(os.environ.get("RANK", "0")) > 0:  # a torchrun rank that follows rank 0
        from conductor_engine.trainer.service import follow

        follow()
        return
    settings = load_settings()
    run_async(_serve_trainer(settings))


async def _serve_trainer(settings: Settings) -> None:
    from conductor_engine.engine.storage.shared_store import close_shared_stores
    from conductor_engine.trainer.service import build_trainer_worker, release_ranks

    conductor = await ConductorClient.connect(settings, start_embedded=False,
                                             wait_s=settings.temporal_connect_timeout)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with build_trainer_worker(conductor.client, settings):
        if not announce_json("trainer polling", task_queue=settings.trainer_task_queue,
                             address=settings.address, metrics=settings.metrics_bind):
            metrics = f" · metrics http://{escape(settings.metrics_bind)}/metrics" \
                if settings.metrics_bind else ""
            err.print(f"trainer polling [bold]{escape(settings.trainer_task_queue)}[/] on "
                      f"{escape(settings.address)}{metrics}; Ctrl-C stops")
        await stop.wait()
    release_ranks()
    await close_shared_stores()
    if not announce_json("trainer stopped", task_queue=settings.trainer_task_queue):
        err.print("trainer stopped")


@train_app.command("prune")
def train_prune(
    policy: Annotated[str, typer.Argument(help="the policy: the conductor's pool id")],
    keep: Annotated[int | None, typer.Option(
        "--keep", min=1, max=MAX_ITERATIONS, help="the newest K versions keep their optimiser "
        "state (recipe [checkpoints] keep_optimizer_states)")] = None,
    keep_checkpoints: Annotated[int | None, typer.Option(
        min=1, max=MAX_ITERATIONS, help="the newest N versions keep their checkpoint, besides "
        "pinned and recently served ones (recipe [checkpoints] keep_checkpoints)")] = None,
    recipe: Annotated[Path | None, typer.Option(
        help="TOML recipe whose [checkpoints] gives the rule (default: the defaults)")] = None,
    dry_run: Annotated[bool, typer.Option(help="list what would go; remove nothing")] = False,
    pool: PoolOpt = None,
) -> None:
    """Apply the retention rule to a policy's published versions now (training applies it
    after every update): old optimiser states and checkpoints leave the blob store; pinned,
    recently served and the newest versions stay. See docs/how-to/checkpoints.md."""
    settings = load_settings(pool)
    rule = _recipe(recipe).checkpoints
    if keep is not None:
        rule.keep_optimizer_states = keep
    if keep_checkpoints is not None:
        rule.keep_checkpoints = keep_checkpoints
    protect = _pool_pin(settings, policy)

    async def go() -> Pruning:
        from conductor_engine.engine.storage.policies import PolicyRegistry
        from conductor_engine.engine.storage.retention import prune

        async with open_trace_store(settings) as store:
            return await prune(PolicyRegistry(store.pool), store.blobs, policy, rule,
                               protect=protect, dry_run=dry_run,
                               caches=[settings.data_dir / "policies", settings.lora_root])

    result = run_async(_storage_errors(go()))
    verb = "would remove" if dry_run else "removed"
    labels = ", ".join(f"v{v}" for v in result.checkpoints) or "none"
    states = ", ".join(f"v{v}" for v in result.optimizer_states) or "none"
    out.print(Text(f"{policy} (newest v{result.newest}): {verb} checkpoints of {labels}; "
                   f"optimiser states of {states}; {len(result.blobs)} blobs, "
                   f"{result.freed_bytes / 1e9:.2f} GB"), highlight=False, soft_wrap=True)
    for ref in result.blobs:
        out.print(Text(f"  {ref}"), highlight=False)


@train_app.command("pin")
def train_pin(
    policy: Annotated[str, typer.Argument(help="the policy: the conductor's pool id")],
    version: Annotated[str, typer.Argument(help="the version to keep: vN")],
    off: Annotated[bool, typer.Option("--off", help="unpin: retention may remove it")] = False,
    pool: PoolOpt = None,
) -> None:
    """Pin a version so retention never removes its checkpoint (or unpin it with --off)."""
    from conductor_engine.engine.contracts.policy_versions import parse_version

    settings = load_settings(pool)
    try:
        number = parse_version(version)
    except ValueError as e:
        raise fail(str(e)) from None
    if not number:
        raise fail(f"{version}: pin a published version vN (the base model is always kept)")

    async def go() -> PolicyVersion:
        from conductor_engine.engine.storage.policies import PolicyRegistry

        async with open_trace_store(settings) as store:
            return await PolicyRegistry(store.pool).set_pinned(policy, number, not off)

    pinned = run_async(_storage_errors(go()))
    err.print(Text(f"{policy} {pinned.label} {'unpinned' if off else 'pinned'}"))


def _pool_pin(settings: Settings, policy: str) -> frozenset[int]:
    """The version the pool file pins for this conductor (`policy_version = "v3"`), which
    prune keeps: runs of that pool need it."""
    from conductor_engine.engine.contracts.policy_versions import parse_version

    conductor = load_pool(settings).conductor
    pinned = parse_version(conductor.policy_version) if conductor.id == policy else None
    return frozenset({pinned}) if pinned else frozenset()


async def _storage_errors(coro: Awaitable[T]) -> T:
    """A policy or blob store problem as LookupError: one `error:` line from run_async."""
    from conductor_engine.engine.storage.blobs import BlobStoreError
    from conductor_engine.engine.storage.policies import PolicyError

    try:
        return await coro
    except (PolicyError, BlobStoreError) as e:
        raise LookupError(str(e)) from None


def _training_tasks(source: str) -> list[Task]:
    """A task file, or a training-mix manifest (`examples/paper/train_mix.toml`) drawn and
    checked against its held-out suites."""
    from conductor_engine.engine.tasks.mix import is_mix
    from conductor_engine.runtime.cli.mix import mix_tasks

    return mix_tasks(source) if is_mix(source) else load_task_file(source)
