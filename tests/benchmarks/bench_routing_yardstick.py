"""The routing yardstick: how far the conductor carries a perfect routing to held-out tasks.

    python -m tests.benchmarks.bench_routing_yardstick [--seeds 27,29] [--init-seeds 0,1,2]
        [--warm-steps 18] [--warm-lr 1e-3] [--warm-tasks-per-step 8] [--updates 0]
        [--orders 1] [--recipe examples/sim/recipe.toml] [--threads 1]

The routing bar counts held-out tasks routed to their tag's competent agent. The recipe's
warm-up learns the training tasks' routing from scored runs; whether the held-out tasks follow
is the model's generalisation from six questions a tag. This benchmark takes the recipe out of
that question: on a generated routing pool (`conductor sim pool --seed S`, the pool
bench_learning trains on) it fine-tunes the policy on every TRAINING task's competent agent
(the answer key, from the sim's skill matrix: **total assistance**, no product run reads it),
the way the warm-up's SFT does (the recipe's LoRA, AdamW at `--warm-lr`, the recipe's gradient
clip, `--warm-tasks-per-step` plans a step: 18 steps of 8 are the warm-up's 6 epochs over 24
tasks), then optionally ascends the exact gradient of the training tasks' expected reward
(`--updates`, bench_exact_gradient's objective: every one-step plan enumerated and scored by its
agent's skill at the task's tag). It repeats that from several LoRA initialisations and
training orders (`--init-seeds`): a held-out question that a perfect training routing sends
to the competent agent under some initialisations and away from it under others is a coin the
recipe cannot be credited or blamed for.

Per pool and initialisation it prints the held-out tasks routed to the competent agent before
and after, each missed question with the agent a greedy conductor picks and pi(competent agent),
and the ratio against the untrained policy in the same run. The plan tree, pi and the oracle
path are tests/benchmarks/_plan_tree.py's (bench_exact_gradient's docstring says what pi is);
the pool is shown whole, in the pool file's order, or with `--orders K` each training task in K
orders the recipe's own pool draw gives (`group_agents`, as its shuffled GRPO rollouts show
the pool; the warm-up's samples keep the file's order, and so do the held-out tasks, as the
held-out evaluation does). One process, `--threads` torch threads.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import torch

from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.contracts.training import (
    Recipe,
    group_agents,
    interleave_tags,
    split_heldout,
)
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.providers.sim_pool import SimPoolSpec, competent, pool_toml, tasks
from conductor_engine.engine.providers.sim_structure import Oracle, PlanStep
from conductor_engine.engine.tasks.files import load_tasks
from conductor_engine.trainer.grpo import make_optimizer
from conductor_engine.trainer.policy import load_policy
from tests.benchmarks._plan_tree import (
    TaskTree,
    choice_logprobs,
    greedy,
    leaves_under,
    oracle_path,
    path_logprobs,
    plan_probabilities,
    scored_tree,
    value,
)

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "examples" / "sim" / "recipe.toml"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="27,29", help="routing pool seeds, comma-separated")
    p.add_argument("--init-seeds", default="0,1,2",
                   help="LoRA initialisations and training orders, comma-separated")
    p.add_argument("--recipe", default=str(RECIPE))
    p.add_argument("--warm-steps", type=int, default=18)
    p.add_argument("--warm-lr", type=float, default=0.0, help="0: the recipe's warm-up rate")
    p.add_argument("--warm-tasks-per-step", type=int, default=8)
    p.add_argument("--updates", type=int, default=0,
                   help="exact-gradient updates after the fine-tune (all training tasks each)")
    p.add_argument("--orders", type=int, default=1,
                   help="pool orders a training task is shown in (1: the file's; more: the "
                   "recipe's shuffled draws, as its rollouts see the pool)")
    p.add_argument("--subtask", default="Solve it")
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args()


def pool_trees(seed: int, recipe: Recipe, tok: Any, compiler: Any, info: Any, subtask: str,
               workdir: Path, orders: int = 1
               ) -> tuple[list[TaskTree], list[TaskTree], dict[str, set[str]]]:
    """The routing pool of `seed` as bench_learning builds it, split as it splits it; a tree
    per task with each one-step plan worth its agent's skill at the task's tags. With `orders`
    above 1, each training task has that many trees, the pool listed in a seeded order in each
    (as the recipe's shuffled rollouts show it); held-out tasks see the file's order, as the
    held-out evaluation does."""
    spec = SimPoolSpec(seed=seed)
    workdir.mkdir(parents=True, exist_ok=True)
    pool_file = workdir / f"pool-{seed}.toml"
    pool_file.write_text(pool_toml(spec))
    task_file = workdir / f"tasks-{seed}.jsonl"
    task_file.write_text("".join(json.dumps(r) + "\n" for r in tasks(spec)))
    loaded = load_tasks(str(task_file)).tasks
    train, held = split_heldout(loaded, recipe.heldout.fraction or 0.25, recipe.heldout.seed)
    train = interleave_tags(train, 0)
    pool = Pool.load(pool_file)
    matrix = spec.skill_matrix()
    right = {t.id: competent(matrix, t.tags) for t in loaded}

    def tree(t: Task, order: int = 0) -> TaskTree:
        shown = pool
        if order:  # the order the recipe's group draw gives this task in iteration `order`
            names = group_agents([a.id for a in pool.agents], recipe.rollouts, seed=0,
                                 name="routing-yardstick", iteration=order, task_id=t.id)
            if names is not None:
                shown = pool.model_copy(update={"agents": [pool.get(n) for n in names]})

        def worth(steps: list[PlanStep]) -> float:
            return max(matrix[s.agent].get(tag, spec.low) for s in steps for tag in t.tags)

        agent = sorted(right[t.id])[0]
        skill = matrix[agent][t.tags[0]]
        oracle = Oracle(id=t.id, kind="one", shape="1 step", plan=[PlanStep(agent=agent)],
                        p_right=skill, cost_usd=0.0, expected_reward=skill)
        return scored_tree(t, oracle, shown, worth, tok, compiler, info, subtask=subtask,
                           max_steps=1)

    trained = [tree(t) for t in train] if orders == 1 else \
        [tree(t, k) for k in range(1, orders + 1) for t in train]
    return trained, [tree(t) for t in held], right


def routed(model: Any, trees: list[TaskTree], right: dict[str, set[str]]
           ) -> tuple[int, list[str]]:
    """How many tasks a greedy conductor routes to a competent agent, and a line per miss."""
    hits, misses = 0, []
    with torch.no_grad():
        for t in trees:
            lp = choice_logprobs(model, t)
            leaf = greedy(t.root, lp)
            agent = leaf.plan[0].agent if leaf.plan else "invalid"
            if agent in right[t.task.id]:
                hits += 1
                continue
            probs = plan_probabilities(t.root, lp)
            p_right = sum(probs.get(x.text, 0.0) for x in {x.text: x for x in
                                                           leaves_under(t.root)}.values()
                          if x.plan and x.plan[0].agent in right[t.task.id])
            misses.append(f"{t.task.question!r} ({t.task.tags[0]}) -> {agent}, "
                          f"pi(competent) {p_right:.3f}")
    return hits, misses


def fine_tune(model: Any, recipe: Recipe, train: list[TaskTree], args: argparse.Namespace,
              order_seed: int) -> float:
    """SFT on each training task's competent agent, as the warm-up fine-tunes on its chosen
    plans: `args.warm_steps` AdamW steps of `args.warm_tasks_per_step` plans in a seeded order.
    Returns the training tasks' mean log pi(competent plan) at the end."""
    lr = args.warm_lr or recipe.warmup.learning_rate
    optimizer = make_optimizer(model, recipe.loss.model_copy(update={"learning_rate": lr}))
    params = [p for p in model.parameters() if p.requires_grad]
    paths = [oracle_path(t, args.subtask) for t in train]
    order = list(range(len(paths)))
    rng = random.Random(order_seed)
    queue: list[int] = []
    for _ in range(args.warm_steps):
        while len(queue) < args.warm_tasks_per_step:  # epochs, each in its own order
            rng.shuffle(order)
            queue += order
        batch = [paths[i] for i in queue[: args.warm_tasks_per_step]]
        del queue[: args.warm_tasks_per_step]
        optimizer.zero_grad(set_to_none=True)
        (-path_logprobs(model, batch).mean()).backward()
        if math.isfinite(float(torch.nn.utils.clip_grad_norm_(params,
                                                               recipe.loss.max_grad_norm))):
            optimizer.step()
    with torch.no_grad():
        return float(path_logprobs(model, paths).mean())


def exact_updates(model: Any, recipe: Recipe, train: list[TaskTree], updates: int) -> None:
    """`updates` steps up the training tasks' expected reward under pi (bench_exact_gradient's
    objective), a fresh optimiser at the recipe's GRPO learning rate."""
    optimizer = make_optimizer(model, recipe.loss)
    params = [p for p in model.parameters() if p.requires_grad]
    for _ in range(updates):
        optimizer.zero_grad(set_to_none=True)
        for t in train:
            (-value(t.root, choice_logprobs(model, t)) / len(train)).backward()
        if math.isfinite(float(torch.nn.utils.clip_grad_norm_(params,
                                                               recipe.loss.max_grad_norm))):
            optimizer.step()


def main(args: argparse.Namespace) -> int:
    import xgrammar as xgr

    torch.set_num_threads(args.threads)
    print("$ python " + " ".join(Path(a).name if a == sys.argv[0] else a for a in sys.argv),
          flush=True)
    recipe = Recipe.model_validate(tomllib.loads(Path(args.recipe).read_text()))
    seeds = [int(s) for s in args.seeds.split(",")]
    inits = [int(s) for s in args.init_seeds.split(",")]
    summary: list[tuple[int, int, int, int]] = []
    for seed in seeds:
        tok = None
        for init in inits:
            started = time.monotonic()
            torch.manual_seed(init)
            policy = load_policy(recipe.policy.model_copy(update={"device": "cpu"}))
            model = policy.model
            model.eval()  # no dropout: the same seed, the same numbers
            if tok is None:
                tok = policy.tokenizer
                info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok),
                                                          stop_token_ids=[tok.eos_token_id])
                compiler = xgr.GrammarCompiler(info, max_threads=1)
                train, held, right = pool_trees(seed, recipe, tok, compiler, info, args.subtask,
                                                ROOT / ".conductor" / "routing-yardstick",
                                                args.orders)
                assert all(len(leaves_under(t.root)) >= 4 for t in train)
                print(f"routing pool seed {seed}: {len(train) // args.orders} training tasks "
                      f"(each in {args.orders} pool order(s)), {len(held)} held out; "
                      f"{train[0].plans} plans a task", flush=True)
            before, _ = routed(model, held, right)
            fit = fine_tune(model, recipe, train, args, init)
            train_hits, _ = routed(model, train, right)
            after, misses = routed(model, held, right)
            line = (f"  init {init}: held out routed {before}/{len(held)} untrained -> "
                    f"{after}/{len(held)} after {args.warm_steps} SFT steps on the competent "
                    f"agents (training prompts {train_hits}/{len(train)}, mean log pi {fit:.3f})")
            if args.updates:
                exact_updates(model, recipe, train, args.updates)
                after, misses = routed(model, held, right)
                line += f" -> {after}/{len(held)} after {args.updates} exact-gradient updates"
            print(line + f"; {time.monotonic() - started:.0f} s", flush=True)
            for m in misses:
                print(f"    missed: {m}", flush=True)
            summary.append((seed, init, before, after))
    print("\npool seed  initialisations  held out all routed  mean routed after / untrained")
    for seed in seeds:
        rows = [r for r in summary if r[0] == seed]
        n = len(held)
        full = sum(after == n for *_, after in rows)
        base = sum(b for _, _, b, _ in rows) / len(rows)
        mean = sum(a for *_, a in rows) / len(rows)
        print(f"{seed:>9}  {len(rows):>15}  {full:>19}  "
              f"{mean / n:.2f} / {base / n:.2f} = {mean / base if base else float('inf'):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
