"""How fast the local conductor learns pools nobody tuned to: generated sim pools, held-out tasks.

    python -m tests.benchmarks.bench_learning [--seeds 1,2,3] [--recipe examples/sim/recipe.toml]
        [--iterations 20] [--tasks-per-tag 8] [--holdout 0.25] [--full] [--via-api]

For each seed: `conductor sim pool` (engine/providers/sim_pool.py) makes 4 look-alike agents, 4 of
the generator's task kinds and `--tasks-per-tag` questions each; a quarter of each tag is held
out. The shipped recipe then trains the local SmolLM2 conductor through TrainingWorkflow on the
rest (real Temporal dev server, PostgreSQL, trainer worker), and every published version answers
the held-out tasks greedily (Recipe.heldout). From the held-out traces it prints, per version:

- routed: the share of held-out tasks whose final step went to a competent agent (the pool's
  best skill for the task's tag);
- reward / oracle: the held-out mean reward over the oracle's, the reward of sending every task
  to its competent agent (the same sim draws, so a perfectly routed version scores exactly 1.0);

and the iteration where both first reach the bar (routed >= 0.9 and reward >= 0.9 of the
oracle). A pool stops at the evaluation after that (which says whether the bar held) unless
--full. The ratio printed at the end is each pool's routing
after training over the untrained conductor's (and over chance, 1 / agents), and the time per
iteration (rollouts + update + held-out evaluation). Deterministic: rollouts and held-out plans
are seeded, so the same seeds print the same curves on a busy machine, only slower.

--via-api serves the conductor behind the OpenAI-compatible wire, as vLLM serves it in
production: the pool's conductor becomes `provider = "openai-compatible"` pointed at a server
that plays vLLM with the same local model (tests/agent_server/local_vllm.py: structured outputs,
served token ids, runtime LoRA routes). Rollouts then take the API path (structured outputs ->
served ids -> forced tokens and choice sets reconstructed by the trainer -> behaviour log-probs
recomputed), and each published version is loaded through `/v1/load_lora_adapter`; the pools,
seeds and figures are the local path's, so the two runs compare line for line.

--pool FILE --tasks FILE trains on a pool and task file of your own instead of a generated one
(a hand-written routing pool, tests/benchmarks/pools/, or one nobody on the team has seen): any
sim pool works, its competent agent per tag read off the agents' `sim` skills. With
--on-training --temperature 1.0 it trains on every task and checks the same tasks, one seeded
sample each at T=1: the measure of the issue's independent routing pool ("all 24 tasks at T=1").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import tomllib
import uuid
from collections import Counter, defaultdict
from contextlib import ExitStack
from pathlib import Path

from conductor_engine.engine.contracts.agent_calls import TaskInfo
from conductor_engine.engine.contracts.names import training_workflow_id
from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.contracts.training import (
    Recipe,
    interleave_tags,
    split_heldout,
)
from conductor_engine.engine.eval import EvalSpec, eval_tasks, system_rows
from conductor_engine.engine.eval.report import HEADER, cells
from conductor_engine.engine.eval.systems import CONDUCTOR, system_of
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.providers.sim import is_right
from conductor_engine.engine.providers.sim_pool import (
    SimPoolSpec,
    competent,
    pool_toml,
    tasks,
)
from conductor_engine.engine.storage.shared_store import close_shared_stores, shared_store
from conductor_engine.engine.storage.trace_store import TraceStore
from conductor_engine.engine.tasks.files import load_tasks
from conductor_engine.runtime.cli.train import warmup_line, warmup_rounds
from conductor_engine.runtime.client import ConductorClient
from conductor_engine.runtime.worker import build_worker
from conductor_engine.trainer.service import build_trainer_worker
from conductor_engine.workflows.train import (
    HeldOutEval,
    TrainingWorkflow,
    TrainInput,
    TrainProgress,
)
from tests.agent_server.local_vllm import LocalVllm
from tests.benchmarks._harness import (
    Stack,
    iteration_line,
    patiently,
    quiet_logs,
    recipe_line,
    run,
    stack,
    table,
)

ROOT = Path(__file__).resolve().parents[2]

ROUTED_BAR = 0.9
REWARD_BAR = 0.9


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="1,2,3", help="comma-separated pool seeds")
    p.add_argument("--recipe", type=Path, default=ROOT / "examples" / "sim" / "recipe.toml")
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--agents", type=int, default=4)
    p.add_argument("--tags", type=int, default=4)
    p.add_argument("--tasks-per-tag", type=int, default=8)
    p.add_argument("--holdout", type=float, default=0.25)
    p.add_argument("--pool", type=Path, default=None,
                   help="a sim pool file to train on instead of generated ones (with --tasks)")
    p.add_argument("--tasks", type=Path, default=None, help="the task file for --pool")
    p.add_argument("--on-training", action="store_true",
                   help="train on every task and evaluate on the same tasks (no held-out "
                   "split): how the independent routing pool is measured")
    p.add_argument("--temperature", type=float, default=None,
                   help="the evaluation's temperature (the recipe's [heldout] temperature, "
                   "greedy by default); 1.0 with --on-training samples as that pool's check")
    p.add_argument("--group-size", type=int, default=None, help="override the recipe's G")
    p.add_argument("--tasks-per-iteration", type=int, default=None)
    p.add_argument("--full", action="store_true", help="run every iteration, not up to the bar")
    p.add_argument("--model", default="smollm2-135m-instruct", help="the conductor's model")
    p.add_argument("--via-api", action="store_true",
                   help="serve the conductor behind the OpenAI-compatible wire (a vLLM-like "
                   "server wrapping the local model) instead of in-process")
    p.add_argument("--eval-table", action="store_true",
                   help="after training, the eval table on the held-out tasks: the untrained "
                   "and the trained conductor beside every baseline")
    return p.parse_args()


def skill_matrix(pool: Pool, tags: set[str]) -> dict[str, dict[str, float]]:
    """agent -> tag -> skill, read off a sim pool's agents (a tag an agent does not list gets
    its default_skill), for every tag the task file uses: what a hand-written pool says."""
    matrix: dict[str, dict[str, float]] = {}
    for a in pool.agents:
        if a.sim is None:
            raise SystemExit(f"agent {a.id!r} is not a sim agent: the bench needs every agent's "
                             "skills to say which one is competent")
        skills = {k.lower(): v for k, v in a.sim.skills.items()}
        matrix[a.id] = {t: skills.get(t.lower(), a.sim.default_skill) for t in sorted(tags)}
    return matrix


class Judge:
    """Routing and oracle reward of held-out runs, from the pool's skill matrix."""

    def __init__(self, matrix: dict[str, dict[str, float]], pool: Pool) -> None:
        self.matrix = matrix
        self.pool = pool

    def oracle(self, run_task_id: str, tags: list[str], reference: str | None) -> float:
        """The reward of the competent agent on this run (0.5 wrong, 1 right: the paper's)."""
        agent = sorted(competent(self.matrix, tags))[0]
        spec = next(a for a in self.pool.agents if a.id == agent)
        assert spec.sim is not None
        right = is_right(spec, spec.sim, TaskInfo(task_id=run_task_id, tags=tags,
                                                  reference=reference))
        return 1.0 if right else 0.5

    async def judge(self, store: TraceStore, e: HeldOutEval
                    ) -> tuple[float, float, float, str]:
        """(routed share, mean reward, oracle mean reward, which agents each tag went to) of
        one held-out evaluation: the last says which tag a stalled curve is missing."""
        traces = await store.batch_traces(e.batch, resolve_blobs=False)
        routed, rewards, oracle = [], [], []
        picks: dict[str, Counter[str]] = defaultdict(Counter)
        for t in traces:
            steps = [s for r in t.rounds for s in r.steps]
            final = steps[-1].agent if steps else None
            right = final in competent(self.matrix, t.task.tags)
            routed.append(right)
            rewards.append(t.reward.value if t.reward and t.reward.value is not None else 0.0)
            oracle.append(self.oracle(t.task.id, t.task.tags, t.task.reference))
            picks["/".join(t.task.tags)][f"{final}{'*' if right else ''}"] += 1
        n = max(len(traces), 1)
        shown = " · ".join(f"{tag} " + ", ".join(f"{a} {k}" for a, k in sorted(c.items()))
                           for tag, c in sorted(picks.items()))
        return sum(routed) / n, sum(rewards) / n, sum(oracle) / n, shown


async def one_pool(s: Stack, args: argparse.Namespace, seed: int, recipe: Recipe,
                   store: TraceStore, workdir: Path, served: LocalVllm | None
                   ) -> dict[str, object]:
    if args.pool is not None:
        pool_file, task_file = args.pool, args.tasks
        label, name = f"pool {args.pool}", f"pool-{args.pool.parent.name}-{args.pool.stem}"
    else:
        spec = SimPoolSpec(agents=args.agents, tags=args.tags, seed=seed,
                           tasks_per_tag=args.tasks_per_tag)
        pool_file = workdir / f"pool-{seed}.toml"
        pool_file.write_text(pool_toml(spec, conductor=args.model))
        task_file = workdir / f"tasks-{seed}.jsonl"
        task_file.write_text("".join(json.dumps(r) + "\n" for r in tasks(spec)))
        # a fixed name: every run has a fresh stack, and the recipe's pool draws are keyed on
        # the training's name, so a random one would give every run its own curve
        label, name = f"pool seed {seed}", f"sim-pool-{seed}"
    loaded: list[Task] = load_tasks(str(task_file)).tasks
    if args.on_training:  # the evaluation's runs are `heldout~ID`: never in a training group
        train, held = list(loaded), list(loaded)
    else:
        train, held = split_heldout(loaded, args.holdout, recipe.heldout.seed)
    train = interleave_tags(train, 0)  # as `conductor train start --seed 0` orders them
    pool = Pool.load(pool_file)
    pool = pool.model_copy(update={"conductor": pool.conductor.model_copy(
        update={"id": f"conductor-{name}"})})
    if served is not None:  # the same conductor, behind the wire
        pool = pool.model_copy(update={"conductor": pool.conductor.model_copy(update={
            "provider": "openai-compatible", "base_url": served.openai_base_url})})
    matrix = skill_matrix(pool, {t for task in loaded for t in task.tags})
    judge = Judge(matrix, pool)
    settings = s.queue(name).model_copy(update={"trainer_task_queue": f"trainer-{name}"})
    client = await s.client()
    print(f"\n{label}: {', '.join(f'{a}: {t}' for a, t in _experts(matrix).items())}; "
          f"{len(train)} training tasks, "
          f"{'all of them checked' if args.on_training else f'{len(held)} held out'}", flush=True)
    inp = TrainInput(name=name, policy=pool.conductor.id, tasks=train, heldout_tasks=held,
                     iterations=args.iterations, recipe=recipe,
                     trainer_task_queue=settings.trainer_task_queue,
                     agents=[a.id for a in pool.available()])
    curve: list[tuple[int, str, float, float]] = []
    crossed: int | None = None
    kept: bool | None = None  # the bar, at the first evaluation after the crossing
    started = time.monotonic()
    async with build_worker(client, settings, pool), build_trainer_worker(client, settings):
        conductor = ConductorClient(client, settings, pool)
        await conductor.start_training(inp)
        handle = client.get_workflow_handle(training_workflow_id(name), result_type=TrainProgress)
        shown = evals = warmed = 0
        while True:
            p = await patiently(lambda: handle.query(TrainingWorkflow.progress))
            for w in warmup_rounds(p)[warmed:]:
                print(warmup_line(w), flush=True)
            warmed = len(warmup_rounds(p))
            for st in p.history[shown:]:
                print(iteration_line(st), flush=True)
            shown = len(p.history)
            for e in p.evals[evals:]:
                routed, reward, oracle, picks = await judge.judge(store, e)
                ratio = reward / oracle if oracle else 0.0
                curve.append((e.iteration, e.version, routed, ratio))
                seen = "checked" if args.on_training else "held out"
                print(f"  {seen} {e.version}: routed {routed:.2f} · reward {reward:.3f} / "
                      f"oracle {oracle:.3f} = {ratio:.2f}\n    picks (* competent): {picks}",
                      flush=True)
                if crossed is None and routed >= ROUTED_BAR and ratio >= REWARD_BAR:
                    crossed = e.iteration
                elif crossed is not None and kept is None and e.iteration > crossed:
                    kept = routed >= ROUTED_BAR and ratio >= REWARD_BAR
                    print(f"  the bar {'held' if kept else 'was NOT held'} at {e.version}",
                          flush=True)
                    if not args.full:  # crossed, and the next evaluation says whether it holds
                        await handle.signal(TrainingWorkflow.stop)
            evals = len(p.evals)
            desc = await patiently(handle.describe)
            if desc.status is not None and desc.status.name != "RUNNING":
                p = await handle.result()
                break
            await asyncio.sleep(1.0)
        seconds = time.monotonic() - started
        evaluated = [e for e in p.evals if e.runs]
        if args.eval_table and len(evaluated) > 1:
            try:
                await eval_table(conductor, store, pool, held, evaluated[0], evaluated[-1], seed)
            except Exception as e:  # the training figures above still stand
                print(f"eval table failed: {type(e).__name__}: {e}", flush=True)
    iterations = max(len(p.history), 1)
    return {"seed": seed if args.pool is None else args.pool.parent.name,
            "crossed": crossed, "held": kept, "curve": curve,
            "iterations": len(p.history), "agents": len(pool.agents),
            "seconds_per_iteration": seconds / iterations,
            "update_seconds": statistics.fmean(h.update_seconds for h in p.history)
            if p.history else 0.0}


async def eval_table(conductor: ConductorClient, store: TraceStore, pool: Pool,
                     held: list[Task], base: HeldOutEval, trained: HeldOutEval, seed: int) -> None:
    """`conductor eval`'s table on the held-out tasks: the untrained and the trained conductor
    (their greedy held-out runs, already made) beside every baseline, run now as one batch."""
    spec = EvalSpec(agents=[a.id for a in pool.agents])
    runs = [t for t in eval_tasks(held, spec) if system_of(t.id) != CONDUCTOR]
    name = f"eval-{seed}-{uuid.uuid4().hex[:6]}"
    await conductor.submit_batch(name, runs, concurrency=50, report=False)
    while (await conductor.batch_progress(name))[0] in ("running", "continued_as_new"):
        await asyncio.sleep(0.5)
    traces = await store.batch_traces(name, resolve_blobs=False)
    for e in (base, trained):
        for t in await store.batch_traces(e.batch, resolve_blobs=False):
            label = f"{CONDUCTOR} {e.version}"
            task = t.task.model_copy(update={"id": t.task.id.replace("heldout~", f"{label}~")})
            traces.append(t.model_copy(update={"task": task}))
    rows = system_rows(traces)
    print(f"\npool seed {seed}, held-out tasks ({len(held)}), conductor greedy:")
    print("| " + " | ".join(HEADER) + " |\n" + "|---" * len(HEADER) + "|")
    for r in rows:
        print("| " + " | ".join(cells(r)) + " |")


def _experts(matrix: dict[str, dict[str, float]]) -> dict[str, str]:
    """agent -> the tags it is competent at (the best skill of the tag)."""
    return {a: ",".join(t for t in row if a in competent(matrix, [t])) or "-"
            for a, row in matrix.items()}


async def main(args: argparse.Namespace) -> int:
    recipe = Recipe.model_validate(tomllib.loads(args.recipe.read_text()))
    if args.temperature is not None:
        recipe.heldout.temperature = args.temperature
    if args.group_size:
        recipe.rollouts.group_size = args.group_size
    if args.tasks_per_iteration:
        recipe.rollouts.groups_per_update = args.tasks_per_iteration
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    if (args.pool is None) != (args.tasks is None):
        raise SystemExit("--pool and --tasks go together: a pool file and its task file")
    if args.pool is not None:
        seeds = seeds[:1]  # the file is the pool; the seed only labels the run
    if args.via_api and recipe.rollouts.explore:  # a served conductor samples without it
        print(f"--via-api: the recipe's explore = {recipe.rollouts.explore} needs the local "
              "conductor; these rollouts do not explore", flush=True)
        recipe.rollouts.explore = 0.0
    print(recipe_line(args.recipe, recipe), flush=True)
    results = []
    print("conductor " + ("behind the OpenAI-compatible wire (a vLLM-like server)"
                          if args.via_api else "in-process (the local provider)"), flush=True)
    with stack() as s, ExitStack() as serving:
        served = serving.enter_context(LocalVllm(args.model)) if args.via_api else None
        store = await shared_store(s.settings)
        try:
            workdir = s.settings.data_dir / "pools"
            workdir.mkdir(parents=True, exist_ok=True)
            for seed in seeds:
                results.append(await one_pool(s, args, seed, recipe, store, workdir, served))
        finally:
            await close_shared_stores()
    if served is not None:
        calls = served.served()
        loads = [c for c in served.lora_calls() if c.route == "load" and c.status == 200]
        print(f"\nserved {len(calls)} completions ({sum(c.constrained for c in calls)} under "
              f"structured_outputs), {sum(c.checkpoint is not None for c in calls)} by a "
              f"trained version; {len(loads)} adapters loaded through /v1/load_lora_adapter")
    rows = []
    for r in results:
        curve, agents = r["curve"], r["agents"]
        assert isinstance(curve, list) and isinstance(agents, int)
        first, last = curve[0], curve[-1]
        reached = "not reached" if r["crossed"] is None else f"{r['crossed']}" + (
            {True: ", held", False: ", not held", None: ""}[r["held"]])  # type: ignore[index]
        rows.append([r["seed"], reached,
                     f"{first[2]:.2f} → {last[2]:.2f}",
                     f"{last[2] / first[2]:.2f}x" if first[2] else "none routed at v0",
                     f"{last[2] * agents:.2f}x", f"{last[3]:.2f}",
                     f"{r['seconds_per_iteration']:.0f}s"])
        print(f"seed {r['seed']} curve (iteration: routed, reward/oracle): "
              + ", ".join(f"{i}: {ro:.2f}/{ra:.2f}" for i, _, ro, ra in curve))
    print()
    print(table(["pool seed", "iterations to bar", "routed v0 → last", "vs untrained",
                 "vs chance", "reward/oracle", "s / iteration"], rows))
    return 0 if all(r["crossed"] is not None for r in results) else 1


if __name__ == "__main__":
    quiet_logs("error")
    sys.exit(run(lambda: main(parse_args())))
