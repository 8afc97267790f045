"""What did a warm-up's selection miss, and why? Kept traces of a structured pool, exact values.

    python -m tests.benchmarks.audit_warmup TRACES --seed S [--recipe R]
    python -m tests.benchmarks.audit_warmup TRACES --pool POOL --tasks TASKS [--recipe R]

TRACES is what `bench_plans --keep-traces FILE` wrote (every stored run of the training run, a JSON
line each), on generated pool S or on a pool and task file from anywhere (`bench_plans --pool
--tasks`: the oracle computed from their own settings, `sim_structure.pool_oracles`). For each
warm-up round it replays the selection the trainer made (trainer/warmup.py `select_plans`, with the
recipe's `[warmup]`) on the runs stored by the end of that round's rehearsal, scores every chosen
plan exactly (engine/providers/sim_structure.py `expected_reward`), and prints the chosen plans'
expected reward over the oracle's. Each task whose choice is worth less than its oracle's is named
with the cause: no oracle plan (the oracle's, or one worth as much: a review's two drafters
swapped) ran on it (exploration), or one ran and its mean fell below the chosen plan's (a lucky
mean won: the chosen plan's mean above its exact value says so), or above it by less than the
recipe's `more_steps_margin` when it has more steps. Rehearsal runs count as the trainer counts
them (the rehearsal batch is the one the kept rehearsals name): whoever ran them. Last, the plans
whose stored runs' mean is furthest from their exact value.
"""

from __future__ import annotations

import argparse
import json
import tomllib
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.contracts.traces import Trace
from conductor_engine.engine.contracts.training import Recipe, WarmupConfig
from conductor_engine.engine.providers.pool import Pool as AgentPool
from conductor_engine.engine.providers.sim_structure import (
    Oracle,
    PlanStep,
    expected_reward,
    pool_oracles,
    roles_of,
    task_parts,
)
from conductor_engine.engine.tasks.files import load_tasks
from conductor_engine.trainer.warmup import (
    has_dead_steps,
    plan_signature,
    rank_plans,
    select_plans,
)
from tests.benchmarks.bench_warmup_ranking import Pool, steps_of

GAP = 0.05
"""A choice worth less than its oracle's by more than this is a miss."""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("traces", type=Path,
                   help="JSON lines of kept traces (bench_plans --keep-traces)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int, help="the generated structured pool's seed")
    which.add_argument("--pool", type=Path, help="a structured pool file (with --tasks)")
    p.add_argument("--tasks", type=Path, help="the task file for --pool")
    p.add_argument("--recipe", type=Path, default=Path("examples/sim/recipe-plans-warmup.toml"))
    args = p.parse_args()
    if args.pool is not None and args.tasks is None:
        p.error("--pool needs --tasks: the task file the pool was trained on")
    return args


class FilePool:
    """A pool and task file from anywhere, as `audit` reads a pool: each task's oracle and a
    plan's exact value under the task's own reward weights."""

    def __init__(self, pool: Path, tasks: Path) -> None:
        loaded: list[Task] = load_tasks(str(tasks)).tasks
        agents = AgentPool.load(pool).available()
        self.roles = roles_of(agents)
        self.oracles: dict[str, Oracle] = pool_oracles(agents, loaded)
        self.tasks = {t.id: t for t in loaded}

    def value(self, task_id: str, plan: list[PlanStep]) -> tuple[float, float, float]:
        task = self.tasks[task_id]
        w = task.options.reward
        return expected_reward(plan, self.roles, task_parts(task), w.wrong,
                               w.cost_penalty_per_usd, w.correct)


def phase(workflow_id: str) -> str:
    """warmup-rK, rehearse(-rK), itN, heldout-vK: the third part of a training run's ids."""
    parts = workflow_id.split("/")
    return parts[2] if len(parts) > 2 else "eval"


def warmup_round(name: str) -> int | None:
    """The round a warm-up sample or rehearsal belongs to (0-based), None for other runs."""
    if name == "rehearse":
        return 0
    for prefix in ("warmup-r", "rehearse-r"):
        if name.startswith(prefix):
            return int(name.removeprefix(prefix))
    return None


def steps_label(steps: Sequence[PlanStep]) -> str:
    """A plan as the report writes it: agents in order, `*` on a step that sees the first."""
    return " > ".join(s.agent + ("*" if s.sees else "") for s in steps)


def label(trace: Trace) -> str:
    return steps_label(steps_of(trace))


def audit(rows: list[tuple[str, Trace]], pool: Pool | FilePool, cfg: WarmupConfig
          ) -> list[str]:
    """The report's lines for `rows` (each stored run with its workflow id's phase)."""
    rounds = [(r, t) for name, t in rows if (r := warmup_round(name)) is not None]
    ids = sorted({t.task.id for _, t in rounds})
    batch = next((t.task.batch for name, t in rows if name.startswith("rehearse")), None)
    out: list[str] = []
    for last in range(max((r for r, _ in rounds), default=-1) + 1):
        runs = [t for r, t in rounds if r <= last]
        ranked, _ = rank_plans(runs, ids, cfg, batch)
        chosen = select_plans(runs, ids, cfg, batch).plans
        value = sum(pool.value(t.task.id, steps_of(t))[0] for t in chosen)
        oracle = sum(pool.oracles[t.task.id].expected_reward for t in chosen)
        dead = sum(has_dead_steps(t) for t in chosen)
        out.append(f"round {last + 1}: {len(chosen)} tasks, chosen / oracle "
                   f"{value / oracle:.3f}, {dead} with a dead step")
        for trace in chosen:
            best = pool.oracles[trace.task.id]
            worth = pool.value(trace.task.id, steps_of(trace))[0]
            if worth >= best.expected_reward - GAP:
                continue
            plan = next(p for p in ranked[trace.task.id]  # a borrowed run is a copy
                        if p.signature == plan_signature(trace))
            ran = [p for p in ranked[trace.task.id]  # best first: the oracle's, or as good
                   if pool.value(trace.task.id, steps_of(p.runs[0]))[0]
                   >= best.expected_reward - 1e-5]  # the oracle rounds to 6 places
            cause = (f"an oracle plan ran: {label(ran[0].runs[0])}, mean "
                     f"{ran[0].mean_reward:.2f} over {len(ran[0].runs)}"
                     if ran else "no oracle plan ran")
            if ran and ran[0].mean_reward >= plan.mean_reward and ran[0].steps > plan.steps:
                cause += f" (above the choice, not by more_steps_margin {cfg.more_steps_margin})"
            out.append(f"  {trace.task.id} ({best.kind}): chose {label(trace)}, worth "
                       f"{worth:.2f}, mean {plan.mean_reward:.2f} over {len(plan.runs)}; oracle "
                       f"{steps_label(best.plan)} "
                       f"{best.expected_reward:.2f}; {cause}")
    # every stored run with a reward, whatever its phase: mean against exact value per plan
    per: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for _, trace in rows:
        task = trace.task.id.split("~")[-1]
        if (trace.depth or trace.reward is None or task not in pool.oracles
                or len(trace.rounds) != 1 or trace.rounds[0].plan is None):
            continue
        acc = per[(task, label(trace))]
        acc[0] += 1
        acc[1] += trace.reward.value
        acc[2] += pool.value(task, steps_of(trace))[0]
    out.append("plans of 20 runs or more whose mean is furthest from their exact value:")
    far = sorted(((s - v) / n, n, key) for key, (n, s, v) in per.items() if n >= 20)
    for diff, n, (task, plan) in far if len(far) <= 8 else [*far[:3], *far[-5:]]:
        out.append(f"  {task} {plan}: {n:.0f} runs, mean - exact {diff:+.3f}")
    return out


def main() -> None:
    args = parse_args()
    cfg = Recipe.model_validate(tomllib.loads(args.recipe.read_text())).warmup
    rows = []
    for line in args.traces.open():
        row = json.loads(line)
        rows.append((phase(row["workflow_id"]), Trace.model_validate(row)))
    pool = Pool(args.seed) if args.seed is not None else FilePool(args.pool, args.tasks)
    print("\n".join(audit(rows, pool, cfg)))


if __name__ == "__main__":
    main()
