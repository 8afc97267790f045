"""Does the local conductor learn plans, not only routing? Structured sim pools, held-out tasks.

    python -m tests.benchmarks.bench_plans [--seeds 1,2,3] [--recipe examples/sim/recipe-plans.toml]
        [--iterations 40] [--tasks-per-kind 8] [--holdout 0.25] [--full] [--no-eval]
        [--eval-repeats R] [--pool FILE --tasks FILE]

For each seed, `conductor sim pool --structure` (engine/providers/sim_structure.py) makes four
look-alike sim agents and four task kinds whose best plans differ: one step to a cheap
specialist, a draft and a reviewer, a split across two specialists (a composite task), one step
to the dear generalist. The recipe trains the local SmolLM2 conductor through TrainingWorkflow
(real Temporal dev server, PostgreSQL, trainer worker) on three quarters of each kind; every
evaluated version answers the held-out quarter greedily. Per evaluation it prints:

- expected / oracle: the mean expected reward of the plans the conductor wrote (exactly, from
  the sim's rules: `sim_structure.expected_reward`; an invalid plan 0) over the mean of the
  oracle's (oracle.jsonl). Expected, not realised, reward is the bar's measure: with a handful
  of held-out tasks one lucky draw moves the realised mean by more than the gaps between plans;
  the realised ratio is printed beside it;
- shapes per kind: the plans written (1 step / draft + review / split / 2 apart) against the
  oracle's, and how many were the oracle's plan exactly.

`--pool FILE --tasks FILE` trains on a structured pool of one's own instead (a hidden one, or
tests/benchmarks/pools/handmade-structure/): each task's oracle computed from the pool file's
sim settings and the task's reward weights (`sim_structure.pool_oracles`), a task's kind its tag.

It stops a pool at the first version with expected/oracle >= 0.9 unless --full, then (unless
--no-eval) runs `conductor eval`'s conductor, single-agent and MoA rows on the held-out tasks:
accuracy, reward and tokens per task, the paper's comparison; with --eval-repeats R, means
over R runs of each task by each system (one run of 8 tasks is mostly the agents' draws: the
oracle's own plans have scored the best single agent's accuracy). Deterministic like
bench_learning.py: the same seeds print the same curves on a busy machine, only slower.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import tomllib
import uuid
from collections import Counter, defaultdict
from pathlib import Path

from conductor_engine.engine.contracts.names import (
    rehearsal_batch,
    training_workflow_id,
    warmup_batch,
)
from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.contracts.tasks import Task, rollout_sampling
from conductor_engine.engine.contracts.traces import Trace
from conductor_engine.engine.contracts.training import (
    Recipe,
    interleave_tags,
    split_heldout,
)
from conductor_engine.engine.eval import EvalSpec, eval_tasks, system_rows
from conductor_engine.engine.eval.report import HEADER, cells
from conductor_engine.engine.eval.systems import (
    CONDUCTOR,
    SOLO,
    repeated,
    run_id,
    system_of,
)
from conductor_engine.engine.plan.language import Plan, Step
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.providers.sim_structure import (
    AgentRole,
    Oracle,
    PlanStep,
    StructuredPoolSpec,
    expected_reward,
    pool_oracles,
    roles_of,
    shape,
    structured_pool_toml,
    structured_tasks,
    task_parts,
)
from conductor_engine.engine.storage.shared_store import close_shared_stores, shared_store
from conductor_engine.engine.storage.trace_store import TraceFilter, TraceStore
from conductor_engine.engine.tasks.files import load_tasks
from conductor_engine.runtime.cli.train import warmup_line, warmup_rounds
from conductor_engine.runtime.client import ConductorClient
from conductor_engine.runtime.worker import build_worker
from conductor_engine.trainer.service import build_trainer_worker
from conductor_engine.trainer.warmup import select_plans
from conductor_engine.workflows.train import (
    HeldOutEval,
    TrainingWorkflow,
    TrainInput,
    TrainProgress,
)
from tests.benchmarks._harness import (
    Stack,
    dump_traces,
    iteration_line,
    patiently,
    quiet_logs,
    recipe_line,
    run,
    stack,
    table,
)

ROOT = Path(__file__).resolve().parents[2]

BAR = 0.9


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="1,2,3", help="comma-separated pool seeds")
    p.add_argument("--recipe", type=Path,
                   default=ROOT / "examples" / "sim" / "recipe-plans.toml")
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--tasks-per-kind", type=int, default=8)
    p.add_argument("--holdout", type=float, default=0.25)
    p.add_argument("--full", action="store_true", help="run every iteration, not up to the bar")
    p.add_argument("--no-eval", action="store_true", help="skip the eval rows after training")
    p.add_argument("--eval-repeats", type=int, default=1, metavar="R",
                   help="the eval rows over R runs of each held-out task by each system "
                   "(`conductor eval --repeats`; the conductor's greedy plan run R times): one "
                   "run a task on 8 tasks measures the agents' draws as much as the systems")
    p.add_argument("--keep-traces", type=Path, metavar="FILE",
                   help="before the benchmark's store is removed, write every run's trace to "
                   "FILE as JSON lines (the rollouts, samples and rehearsals, for analysis)")
    p.add_argument("--eval-only", action="store_true",
                   help="no training: only the single-agent and MoA rows on the held-out tasks "
                   "(and the base conductor's with --eval-repeats above 1)")
    p.add_argument("--model", default="smollm2-135m-instruct", help="the conductor's model")
    p.add_argument("--pool", type=Path, default=None,
                   help="a structured sim pool file of your own instead of generated ones (with "
                   "--tasks): each task's oracle is computed from the agents' `sim` settings "
                   "and the task's reward weights; a task's kind is its tag")
    p.add_argument("--tasks", type=Path, default=None, help="the task file for --pool")
    p.add_argument("--warmup-samples", type=int, default=0, metavar="K",
                   help="before training, K scored runs of each training task by the base "
                   "conductor, exploring as the recipe's rollouts do: the stored runs a recipe's "
                   "[warmup] learns from (the policy's own exploring rollouts)")
    return p.parse_args()


class Judge:
    """The expected reward and shape of the plans a version wrote, against the oracle's."""

    def __init__(self, agents: dict[str, AgentRole], oracles: dict[str, Oracle],
                 tasks: list[Task]) -> None:
        self.agents, self.oracles = agents, oracles
        self.parts = {t.id: task_parts(t) for t in tasks}
        self.weights = {t.id: t.options.reward for t in tasks}
        self.tokens = 0.0  # per task, at the last evaluation judged (conductor and agents)

    def written(self, t: Trace) -> tuple[list[PlanStep] | None, float]:
        """The plan a trace ran (None when it had none) and its expected reward."""
        steps = [s for r in t.rounds for s in r.steps]
        if not steps or any(s.agent not in self.agents for s in steps):
            return None, 0.0
        plan = [PlanStep(agent=s.agent, sees=list(s.sees)) for s in steps]
        if len(plan) > 2:  # the tasks allow two steps; a longer plan would be refused
            return plan, 0.0
        task = _plain(t.task.id)
        w = self.weights[task]
        value, _, _ = expected_reward(plan, self.agents, self.parts[task], w.wrong,
                                      w.cost_penalty_per_usd, w.correct)
        return plan, value

    async def judge(self, store: TraceStore, e: HeldOutEval
                    ) -> tuple[float, float, float, dict[str, Counter[str]], Counter[str]]:
        """(expected, realised and oracle mean reward, shapes written per kind, oracle plans
        written per kind) of one held-out evaluation."""
        traces = await store.batch_traces(e.batch, resolve_blobs=False)
        expected, realised, oracle = [], [], []
        shapes: dict[str, Counter[str]] = defaultdict(Counter)
        exact: Counter[str] = Counter()
        for t in traces:
            best = self.oracles[_plain(t.task.id)]
            plan, value = self.written(t)
            expected.append(value)
            realised.append(t.reward.value if t.reward and t.reward.value is not None else 0.0)
            oracle.append(best.expected_reward)
            parts = self.parts[_plain(t.task.id)]
            shapes[best.kind][shape(plan, parts) if plan else "invalid"] += 1
            exact[best.kind] += plan == best.plan
        n = max(len(traces), 1)
        self.tokens = sum(t.totals.usage.input_tokens + t.totals.usage.output_tokens
                          for t in traces) / n
        return sum(expected) / n, sum(realised) / n, sum(oracle) / n, shapes, exact


    async def rollout_shapes(self, store: TraceStore, policy: str, version: str
                             ) -> Counter[str]:
        """The shapes of the plans one version's training rollouts wrote (the held-out runs,
        `heldout~ID`, left out): whether the rollouts try the plans GRPO must credit."""
        found = await store.search(TraceFilter(policy_name=policy, policy_version=version),
                                   limit=10_000)
        shapes: Counter[str] = Counter()
        for summary in found:
            if "~" in summary.task_id:
                continue
            t = await store.get(summary.workflow_id, resolve_blobs=False)
            plan = self.written(t)[0] if t is not None else None
            shapes[shape(plan, self.parts[summary.task_id]) if plan else "invalid"] += 1
        return shapes


def _plain(run_id: str) -> str:
    """The task id of a held-out or eval run ("heldout~ID", "SYSTEM~ID")."""
    return run_id.rsplit("~", 1)[-1]


def _shapes_line(shapes: dict[str, Counter[str]], exact: Counter[str],
                 oracles: dict[str, Oracle]) -> str:
    oracle_shape = {o.kind: o.shape for o in oracles.values()}
    return " · ".join(
        f"{kind} [oracle {oracle_shape[kind]}]: "
        + ", ".join(f"{s} {k}" for s, k in sorted(c.items()))
        + f" (oracle plan {exact[kind]}/{sum(c.values())})"
        for kind, c in sorted(shapes.items()))


def generated(seed: int, args: argparse.Namespace, workdir: Path
              ) -> tuple[Path, Path, dict[str, Oracle], str]:
    """`conductor sim pool --structure --seed S`'s files, its oracles and a line on its roles."""
    spec = StructuredPoolSpec(seed=seed, tasks_per_kind=args.tasks_per_kind)
    pool_file = workdir / f"structure-{seed}.toml"
    pool_file.write_text(structured_pool_toml(spec, conductor=args.model))
    rows = structured_tasks(spec)
    task_file = workdir / f"structure-{seed}.jsonl"
    task_file.write_text("".join(json.dumps(r) + "\n" for r, _ in rows))
    return (pool_file, task_file, {o.id: o for _, o in rows},
            f"structured pool seed {seed}: roles {spec.roles()}, tags {spec.tags()}")


async def one_pool(s: Stack, args: argparse.Namespace, seed: int | str, recipe: Recipe,
                   store: TraceStore, workdir: Path) -> dict[str, object]:
    if isinstance(seed, int):
        pool_file, task_file, oracles, about = generated(seed, args, workdir)
        name = f"sim-structure-{seed}"  # fixed: the recipe's pool draws are keyed on it
    else:  # a pool written by anyone: its oracle computed from its own files
        pool_file, task_file, about = args.pool, args.tasks, f"pool {args.pool}"
        name = f"pool-{args.pool.parent.name}-{args.pool.stem}"
    loaded: list[Task] = load_tasks(str(task_file)).tasks
    pool = Pool.load(pool_file)
    if not isinstance(seed, int):
        oracles = pool_oracles(pool.available(), loaded)
        about += ", oracle plans: " + "; ".join(sorted({
            f"{o.kind} {' -> '.join(st.agent for st in o.plan)} ({o.shape})"
            for o in oracles.values()}))
    train, held = split_heldout(loaded, args.holdout, recipe.heldout.seed)
    train = interleave_tags(train, 0)
    pool = pool.model_copy(update={"conductor": pool.conductor.model_copy(
        update={"id": f"conductor-{name}"})})
    judge = Judge(roles_of(pool.available()), oracles, loaded)
    settings = s.queue(name).model_copy(update={"trainer_task_queue": f"trainer-{name}"})
    client = await s.client()
    print(f"\n{about}; {len(train)} training tasks, {len(held)} held out", flush=True)
    inp = TrainInput(name=name, policy=pool.conductor.id, tasks=train, heldout_tasks=held,
                     iterations=args.iterations, recipe=recipe,
                     trainer_task_queue=settings.trainer_task_queue,
                     agents=[a.id for a in pool.available()])
    if args.eval_only:
        async with build_worker(client, settings, pool):
            await eval_rows(ConductorClient(client, settings, pool), store, pool, held, None, seed,
                            oracles, args.eval_repeats)
        return {"seed": seed, "crossed": None, "curve": [], "shapes": "", "iterations": 0,
                "seconds_per_iteration": 0.0}
    curve: list[tuple[int, str, float, float]] = []
    last_shapes = ""
    crossed: int | None = None
    started = time.monotonic()
    async with build_worker(client, settings, pool), build_trainer_worker(client, settings):
        conductor = ConductorClient(client, settings, pool)
        if args.warmup_samples:
            await scored_samples(conductor, train, recipe, args.warmup_samples, name)
            tried = await judge.rollout_shapes(store, pool.conductor.id, "base")
            print("  base samples wrote: " + ", ".join(
                f"{s} {k}" for s, k in sorted(tried.items())), flush=True)
        await conductor.start_training(inp)
        handle = client.get_workflow_handle(training_workflow_id(name), result_type=TrainProgress)
        shown = evals = warmed = 0
        while True:
            p = await patiently(lambda: handle.query(TrainingWorkflow.progress))
            for w in warmup_rounds(p)[warmed:]:
                print(warmup_line(w), flush=True)
                for line in await selections(store, judge, train, recipe, pool.conductor.id,
                                             name, w.rehearsal is not None):
                    print(line, flush=True)
            warmed = len(warmup_rounds(p))
            for st in p.history[shown:]:
                print(iteration_line(st), flush=True)
                tried = await judge.rollout_shapes(store, pool.conductor.id, st.version)
                print("    rollouts wrote: " + ", ".join(
                    f"{s} {k}" for s, k in sorted(tried.items())), flush=True)
            shown = len(p.history)
            for e in p.evals[evals:]:
                expected, realised, oracle, shapes, exact = await judge.judge(store, e)
                ratio = expected / oracle if oracle else 0.0
                curve.append((e.iteration, e.version, ratio, realised / oracle if oracle else 0))
                last_shapes = _shapes_line(shapes, exact, oracles)
                print(f"  held out {e.version}: expected {expected:.3f} / oracle {oracle:.3f} = "
                      f"{ratio:.2f} (realised {realised:.3f}; {judge.tokens:.0f} tokens a "
                      f"task)\n    shapes: {last_shapes}",
                      flush=True)
                if crossed is None and ratio >= BAR:
                    crossed = e.iteration
                    if not args.full:
                        await handle.signal(TrainingWorkflow.stop)
            evals = len(p.evals)
            desc = await patiently(handle.describe)
            if desc.status is not None and desc.status.name != "RUNNING":
                p = await handle.result()
                break
            await asyncio.sleep(1.0)
        seconds = time.monotonic() - started
        evaluated = [e for e in p.evals if e.runs]
        if not args.no_eval and evaluated:
            try:
                await eval_rows(conductor, store, pool, held, evaluated[-1], seed, oracles,
                                args.eval_repeats)
            except Exception as e:  # the training figures above still stand
                print(f"eval rows failed: {type(e).__name__}: {e}", flush=True)
    return {"seed": seed, "crossed": crossed, "curve": curve, "shapes": last_shapes,
            "iterations": len(p.history),
            "seconds_per_iteration": seconds / max(len(p.history), 1)}


async def selections(store: TraceStore, judge: Judge, train: list[Task], recipe: Recipe,
                     policy: str, name: str, rehearsed: bool) -> list[str]:
    """What each warm-up ranking would select from the same stored runs (the base samples,
    and the rehearsal's runs where there was one; no GRPO rollout), judged exactly: per kind
    the selected plans' shapes and oracle plans, and their mean expected reward over the
    oracle's. The rehearsal is measured, not assumed: the same samples, ranked three ways."""
    ids = [t.id for t in train]
    cfg = recipe.warmup
    batch = rehearsal_batch(name)
    before_training = [r.trace for r in await store.scored_runs(ids, per_task=cfg.recent_runs)
                       if r.trace is not None
                       and (r.trace.policy.name != policy or r.trace.policy.version == "base"
                            or r.trace.task.batch == warmup_batch(name))]
    samples = [t for t in before_training if t.task.batch != batch]
    by_run = revised(cfg, rank="run", rehearse=0)
    ways = [("best run by reward", select_plans(samples, ids, by_run)),
            ("plan mean, samples only", select_plans(samples, ids,
                                                     revised(cfg, rank="plan_mean")))]
    if rehearsed:
        ways.append(("plan mean, rehearsed", select_plans(before_training, ids,
                                                          revised(cfg, rank="plan_mean"),
                                                          batch)))
    lines = []
    for label, chosen in ways:
        shapes: dict[str, Counter[str]] = defaultdict(Counter)
        exact: Counter[str] = Counter()
        expected = oracle = 0.0
        for t in chosen.plans:
            best_plan = judge.oracles[t.task.id]
            plan, value = judge.written(t)
            shapes[best_plan.kind][shape(plan, judge.parts[t.task.id]) if plan else "none"] += 1
            exact[best_plan.kind] += plan == best_plan.plan
            expected, oracle = expected + value, oracle + best_plan.expected_reward
        mean = expected / oracle if oracle else 0.0
        lines.append(f"  warm-up selection, {label}: {len(chosen.plans)} plans, expected / "
                     f"oracle {mean:.2f}\n    shapes: "
                     f"{_shapes_line(shapes, exact, judge.oracles)}")
    return lines


async def scored_samples(conductor: ConductorClient, train: list[Task], recipe: Recipe,
                         k: int, name: str) -> None:
    """K runs of each training task by the current conductor at the recipe's temperature,
    exploring as its rollouts do, each seeded and scored: what `[warmup]` selects from."""
    slots = asyncio.Semaphore(16)
    started = time.monotonic()

    async def one(task: Task, sample: int) -> None:
        options = revised(task.options, temperature=recipe.loss.temperature,
                          max_plan_attempts=1)
        sampling = rollout_sampling(sample, explore=recipe.rollouts.explore,
                                    explore_importance=recipe.rollouts.explore_importance)
        async with slots:
            wid = await conductor.submit(revised(task, options=options, sampling=sampling),
                                         workflow_id=f"sample-{name}-{task.id}-{sample}")
            with contextlib.suppress(Exception):  # a failed run is no candidate anyway
                await conductor.result(wid)

    await asyncio.gather(*(one(t, j) for t in train for j in range(k)))
    print(f"  {k} scored samples of {len(train)} training tasks in "
          f"{time.monotonic() - started:.0f}s", flush=True)


def _oracle_run(task: Task, best: Oracle) -> Task:
    """The task as the system "oracle" runs it: the oracle's plan, fixed."""
    steps = [Step(agent=s.agent, subtask=SOLO, access=list(s.sees)) for s in best.plan]
    options = task.options.model_copy(update={"plan": Plan(steps=steps)})
    return task.model_copy(update={"id": run_id("oracle", task.id), "options": options})


async def eval_rows(conductor: ConductorClient, store: TraceStore, pool: Pool,
                    held: list[Task], trained: HeldOutEval | None, seed: int | str,
                    oracles: dict[str, Oracle], repeats: int = 1) -> None:
    """`conductor eval`'s rows on the held-out tasks: the trained conductor, every single
    agent, MoA and the oracle's plans, run now as one batch. With one repeat the conductor's
    row is its greedy held-out runs, already made (none with --eval-only); with R it is its
    greedy plan run R times at the evaluated version (base with --eval-only), like every other
    system."""
    version = trained.version if trained else "base"
    spec = EvalSpec(agents=[a.id for a in pool.agents], baselines=["single", "moa"],
                    repeats=repeats, policy_version=version)
    runs = [t for t in eval_tasks(held, spec) if repeats > 1 or system_of(t.id) != CONDUCTOR]
    runs += [_oracle_run(again, oracles[t.id]) for t in held for again in repeated(t, repeats)]
    # a fixed plan is not the conductor's, so the tasks' two-step limit does not bind MoA;
    # the conductor plans greedily, as on its held-out runs
    runs = [revised(t, options=revised(t.options, temperature=0.0))
            if system_of(t.id) == CONDUCTOR else
            revised(t, options=revised(t.options, max_steps=20))
            for t in runs]
    name = f"eval-structure-{seed}-{uuid.uuid4().hex[:6]}"
    await conductor.submit_batch(name, runs, concurrency=50, report=False)
    while (await conductor.batch_progress(name))[0] in ("running", "continued_as_new"):
        await asyncio.sleep(0.5)
    traces = await store.batch_traces(name, resolve_blobs=False)
    if trained is not None and repeats == 1:  # its greedy held-out runs, already made
        label = f"{CONDUCTOR} {trained.version}"
        for t in await store.batch_traces(trained.batch, resolve_blobs=False):
            task = t.task.model_copy(update={"id": t.task.id.replace("heldout~", f"{label}~")})
            traces.append(t.model_copy(update={"task": task}))
    rows = system_rows(traces)
    print(f"\nstructured pool seed {seed}, held-out tasks ({len(held)}), conductor {version} "
          f"greedy, {repeats} run(s) of each task by each system:")
    print("| " + " | ".join(HEADER) + " |\n" + "|---" * len(HEADER) + "|")
    for r in rows:
        print("| " + " | ".join(cells(r)) + " |")
    moa = next((r for r in rows if r.system == "moa"), None)
    mine = next((r for r in rows if r.system.startswith(CONDUCTOR)), None)
    if moa and mine and moa.tokens_per_task:
        print(f"conductor tokens per task / MoA's: {mine.tokens_per_task / moa.tokens_per_task:.2f}"
              f"x", flush=True)


async def main(args: argparse.Namespace) -> int:
    recipe = Recipe.model_validate(tomllib.loads(args.recipe.read_text()))
    if (args.pool is None) != (args.tasks is None):
        raise SystemExit("--pool and --tasks go together: a pool file and its task file")
    seeds: list[int | str] = (  # a pool of one's own is labelled by its folder and file
        [int(x) for x in args.seeds.split(",") if x.strip()] if args.pool is None
        else [f"{args.pool.parent.name}-{args.pool.stem}"])
    print(recipe_line(args.recipe, recipe), flush=True)
    results = []
    with stack() as s:
        store = await shared_store(s.settings)
        try:
            workdir = s.settings.data_dir / "pools"
            workdir.mkdir(parents=True, exist_ok=True)
            for seed in seeds:
                results.append(await one_pool(s, args, seed, recipe, store, workdir))
        finally:
            if args.keep_traces:
                kept = await dump_traces(store, args.keep_traces)
                print(f"{kept:,} traces written to {args.keep_traces}", flush=True)
            await close_shared_stores()
    if args.eval_only:
        return 0
    rows = []
    for r in results:
        curve = r["curve"]
        assert isinstance(curve, list)
        first, last = curve[0], curve[-1]
        rows.append([r["seed"], r["crossed"] if r["crossed"] is not None else "not reached",
                     f"{first[2]:.2f} → {last[2]:.2f}", f"{last[3]:.2f}",
                     f"{r['seconds_per_iteration']:.0f}s"])
        print(f"seed {r['seed']} curve (iteration: expected/oracle): "
              + ", ".join(f"{i}: {ra:.2f}" for i, _, ra, _ in curve))
        print(f"seed {r['seed']} last shapes: {r['shapes']}")
    print()
    print(table(["pool seed", "iterations to 0.9 of oracle", "expected/oracle v0 → last",
                 "realised/oracle last", "s / iteration"], rows))
    return 0 if all(r["crossed"] is not None for r in results) else 1


if __name__ == "__main__":
    quiet_logs("error")
    sys.exit(run(lambda: main(parse_args())))
