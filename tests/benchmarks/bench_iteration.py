"""Where a training iteration's time goes: the shipped sim recipe, one iteration at a time.

    python -m tests.benchmarks.bench_iteration [--iterations 2] [--seed 1] [--tasks-per-tag 12]
        [--recipe examples/sim/recipe.toml] [--baseline]

A generated routing pool (`conductor sim pool`, 4 agents, 4 tags), the local SmolLM2-135M
conductor and the recipe's iterations (8 tasks x G = 4 rollouts, mu = 4 clipped steps, LoRA r 16)
run through TrainingWorkflow on a real Temporal dev server and PostgreSQL, with the conduct and
trainer workers in this process, no held-out evaluation. Per iteration it prints the time split
into phases:

- plan generation: the local provider's generation thread busy (engine/providers/local/
  batching.py `GenerationQueue.work`), prompt tokens prefilled and tokens sampled;
- agents, workflow, database, trainer I/O: the rest of the iteration's wall time (sim agent
  activities, the score and record activities, workflow tasks, the trace store; the update's
  selection of groups, checkpoint save and publish);
- old / reference log-probs: no pass when every sample carries the log-probs its sampler
  recorded and beta = 0 (counted: samples without them get the first step's own);
- forward + backward and optimiser: train_step's time, the optimiser's steps measured with
  torch's global optimiser hooks;
- pick-up: the provider building the version an iteration samples from (the held base copied,
  the adapter merged), before its first plan;

tokens computed by the update's passes against the tokens in its samples, and the process's
peak RSS during the iteration (VmHWM, reset at each iteration boundary).

--baseline runs the same iterations twice, each in a fresh process and stack with the same
pool and training name (so the same seeded rollouts): first with the trainer's new paths off
(trainer/grpo/_prefix.py `SHARE_UPDATE_PREFIX` False), then on, and prints the
ratio of the two iterations' times. On a shared machine only the ratio means much.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from temporalio.service import RPCError

from conductor_engine.engine.contracts.names import training_workflow_id
from conductor_engine.engine.contracts.training import (
    Recipe,
    interleave_tags,
    split_heldout,
)
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.providers.sim_pool import SimPoolSpec, pool_toml, tasks
from conductor_engine.engine.storage.policies import PolicyRegistry
from conductor_engine.engine.storage.shared_store import close_shared_stores, shared_store
from conductor_engine.engine.tasks.files import load_tasks
from conductor_engine.runtime.client import ConductorClient
from conductor_engine.runtime.worker import build_worker
from conductor_engine.trainer.service import build_trainer_worker
from conductor_engine.workflows.train import (
    TrainingWorkflow,
    TrainInput,
)
from tests.benchmarks._harness import (
    quiet_logs,
    recipe_line,
    run,
    stack,
    table,
)

ROOT = Path(__file__).resolve().parents[2]

PHASES = ("plan generation", "agents, workflow, database, trainer I/O", "old / ref log-probs",
          "forward + backward", "optimiser", "pick-up")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recipe", type=Path, default=ROOT / "examples" / "sim" / "recipe.toml")
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--seed", type=int, default=1, help="the generated pool's seed")
    p.add_argument("--tasks-per-tag", type=int, default=12)
    p.add_argument("--model", default="smollm2-135m-instruct", help="the conductor's model")
    p.add_argument("--baseline", action="store_true",
                   help="also run today's iteration (the new paths off), in its own process "
                   "first, and print the ratio")
    p.add_argument("--json", type=Path, default=None, help=argparse.SUPPRESS)  # a child's out
    p.add_argument("--old-paths", action="store_true", help=argparse.SUPPRESS)  # a child's mode
    return p.parse_args()


def _peak_rss_reset() -> None:
    """Reset VmHWM (Linux: writing 5 to clear_refs), so the next read is this iteration's."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _peak_rss_gb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return 0.0


class OptimiserClock:
    """Seconds spent in optimiser steps, from torch's global step hooks."""

    def __init__(self) -> None:
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        self.seconds = 0.0
        self._t = 0.0
        register_optimizer_step_pre_hook(self._pre)
        register_optimizer_step_post_hook(self._post)

    def _pre(self, *_: Any) -> None:
        self._t = time.perf_counter()

    def _post(self, *_: Any) -> None:
        self.seconds += time.perf_counter() - self._t


async def one_run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The iterations, each as a row of figures."""
    from conductor_engine.engine.providers.local import batching, model

    recipe = Recipe.model_validate(tomllib.loads(args.recipe.read_text()))
    recipe.heldout.fraction = 0.0  # the training iteration only ...
    recipe.warmup.enabled = False  # ... not the warm-up before it
    clock = OptimiserClock()
    rows: list[dict[str, Any]] = []
    with stack() as s:
        store = await shared_store(s.settings)
        try:
            spec = SimPoolSpec(agents=4, tags=4, seed=args.seed, tasks_per_tag=args.tasks_per_tag)
            workdir = s.settings.data_dir / "pools"
            workdir.mkdir(parents=True, exist_ok=True)
            (workdir / "pool.toml").write_text(pool_toml(spec, conductor=args.model))
            (workdir / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n"
                                                         for r in tasks(spec)))
            loaded = load_tasks(str(workdir / "tasks.jsonl")).tasks
            train, _ = split_heldout(loaded, 0.25, recipe.heldout.seed)
            train = interleave_tags(train, 0)
            name = f"sim-pool-{args.seed}"  # the same name, so the same draws, in both runs
            pool = Pool.load(workdir / "pool.toml")
            pool = pool.model_copy(update={"conductor": pool.conductor.model_copy(
                update={"id": f"conductor-{name}"})})
            settings = s.queue(name).model_copy(update={"trainer_task_queue": f"trainer-{name}"})
            client = await s.client()
            inp = TrainInput(name=name, policy=pool.conductor.id, tasks=train,
                             iterations=args.iterations, recipe=recipe,
                             trainer_task_queue=settings.trainer_task_queue,
                             agents=[a.id for a in pool.available()])
            registry = PolicyRegistry(store.pool)
            async with build_worker(client, settings, pool), \
                    build_trainer_worker(client, settings):
                await ConductorClient(client, settings, pool).start_training(inp)
                handle = client.get_workflow_handle(training_workflow_id(name))
                _peak_rss_reset()
                # driven by the registry (the database), not by queries: a workflow task that
                # a starved machine times out must not stop the measurement
                mark, optimiser_before = time.monotonic(), 0.0
                for it in range(args.iterations):
                    while (await registry.latest_version(inp.policy)) < it + 1:
                        await asyncio.sleep(0.5)
                    now = time.monotonic()
                    wall, mark = now - mark, now
                    rss = _peak_rss_gb()
                    _peak_rss_reset()
                    version = await registry.get(inp.policy, it + 1)
                    m = version.metrics
                    opt = clock.seconds - optimiser_before
                    optimiser_before = clock.seconds
                    # the queue's versions in the order first generated: base, v1, ...
                    versions = list(batching.queue.work)
                    checkpoint = versions[it] if it < len(versions) else None
                    work = batching.queue.work.get(checkpoint, batching.Work())
                    pickup = next((lm.load_seconds for k, lm in model.loaded_models.items()
                                   if checkpoint and k.endswith(f"@{checkpoint}")), 0.0)
                    step_s = float(m.get("seconds", 0.0))
                    rows.append({
                        "iteration": it, "reward": m.get("mean_reward"),
                        "loss": m.get("loss"), "grad_norm": m.get("grad_norm"),
                        "wall": wall,
                        "plan generation": work.seconds,
                        "agents, workflow, database, trainer I/O": wall - work.seconds - step_s,
                        "old / ref log-probs": 0.0,
                        "forward + backward": step_s - opt,
                        "optimiser": opt,
                        "pick-up": pickup,
                        "prompt tokens": work.prompt_tokens,
                        "sampled tokens": work.generated_tokens,
                        "update tokens": m.get("sample_tokens", 0),
                        "passed tokens": m.get("passed_tokens", 0),
                        "peak rss gb": rss,
                    })
                    print(f"  it {it}: {wall:.0f} s, reward {m.get('mean_reward') or 0:.3f}, "
                          f"loss {m.get('loss') or 0:.6f}, |g| {m.get('grad_norm') or 0:.6f}, "
                          f"train_step {step_s:.0f} s, generation {work.seconds:.0f} s, "
                          f"peak RSS {rss:.2f} GB", flush=True)
                with contextlib.suppress(RPCError):  # the last iteration may have ended it
                    await handle.signal(TrainingWorkflow.stop)
        finally:
            await close_shared_stores()
    return rows


def _fmt(rows: list[dict[str, Any]], label: str) -> str:
    head = ["phase (s)", *[f"it {r['iteration']}" for r in rows]]
    body = [[ph, *[f"{r[ph]:.1f}" for r in rows]] for ph in PHASES]
    body.append(["iteration (wall)", *[f"{r['wall']:.1f}" for r in rows]])
    body.append(["plan tokens prefilled / sampled",
                 *[f"{r['prompt tokens']} / {r['sampled tokens']}" for r in rows]])
    body.append(["update tokens passed / in samples",
                 *[f"{r['passed tokens']} / {r['update tokens']}" for r in rows]])
    body.append(["peak RSS (GB)", *[f"{r['peak rss gb']:.2f}" for r in rows]])
    body.append(["reward · loss · |g|", *[f"{r['reward'] or 0:.3f} · {r['loss'] or 0:.5f} · "
                                          f"{r['grad_norm'] or 0:.4f}" for r in rows]])
    return f"{label}\n{table(head, body)}"


def child(args: argparse.Namespace, baseline: bool) -> list[dict[str, Any]]:
    """One run in a fresh process (fresh memory, fresh stack), its rows read back."""
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-iteration-{os.getpid()}-{baseline}.json"
    cmd = [sys.executable, "-m", "tests.benchmarks.bench_iteration", "--iterations",
           str(args.iterations), "--seed", str(args.seed), "--tasks-per-tag",
           str(args.tasks_per_tag), "--recipe", str(args.recipe), "--model", args.model,
           "--json", str(out)]
    subprocess.run(cmd + ["--old-paths"] * baseline, check=True)
    rows: list[dict[str, Any]] = json.loads(out.read_text())
    out.unlink()
    return rows


async def main(args: argparse.Namespace) -> int:
    recipe = Recipe.model_validate(tomllib.loads(args.recipe.read_text()))
    if args.json is not None:  # a child: one run, its rows to the file
        rows = await one_run(args)
        args.json.write_text(json.dumps(rows))
        return 0
    print(recipe_line(args.recipe, recipe), flush=True)
    runs: dict[str, list[dict[str, Any]]] = {}
    if args.baseline:
        print("today's iteration (new paths off):", flush=True)
        runs["baseline"] = child(args, baseline=True)
    print("this iteration:", flush=True)
    runs["new"] = child(args, baseline=False)
    for label, rows in runs.items():
        print()
        print(_fmt(rows, f"{label}: seconds per phase, 2 cores shared"))
    if "baseline" in runs:
        old = sum(r["wall"] for r in runs["baseline"])
        new = sum(r["wall"] for r in runs["new"])
        upd_old = sum(r["forward + backward"] + r["optimiser"] for r in runs["baseline"])
        upd_new = sum(r["forward + backward"] + r["optimiser"] for r in runs["new"])
        print(f"\niteration time, new / today: {new / old:.2f} ({old / new:.2f}x faster); "
              f"train_step: {upd_new / upd_old:.2f} ({upd_old / upd_new:.2f}x faster)")
        same = [(a["reward"], b["reward"]) for a, b in zip(runs["baseline"], runs["new"],
                                                           strict=False)]
        print(f"rollout rewards, today vs new: {same}")
    return 0


if __name__ == "__main__":
    quiet_logs("error")
    arguments = parse_args()
    if arguments.old_paths:
        from conductor_engine.trainer.grpo import _prefix

        _prefix.SHARE_UPDATE_PREFIX = False
    sys.exit(run(lambda: main(arguments)))
