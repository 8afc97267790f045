"""The yardstick: the exact policy gradient over every plan, on a structured sim pool.

    python -m tests.benchmarks.bench_exact_gradient [--seed 1] [--updates 40]
        [--recipe examples/sim/recipe-plans.toml] [--tasks-per-update 0] [--subtask "Solve it"]
        [--threads 1] [--warm-start oracle --warm-steps 60 --warm-lr 1e-3]

GRPO samples a few plans per task and credits them against each other; when it stalls, the
question is whether the sampled method failed to find the plans (exploration, credit) or the
model cannot represent them. This benchmark takes sampling out: for each training task of a
structured pool (`conductor sim pool --structure`, docs/how-to/rehearse-plans.md) it enumerates
every plan the conductor could write under the plan grammar, scores each exactly with the
sim's expected reward (`sim_structure.expected_reward`), and ascends

    J(theta) = mean over tasks of  sum over plans p of  pi_theta(p | task) * E[reward | p]

with the recipe's LoRA policy (`trainer.policy.load_policy`), its optimiser
(`trainer.grpo.make_optimizer`, AdamW at the recipe's learning rate) and its gradient clip.
Exact, not sampled: no rollout, no advantage, no variance. If this cannot reach 0.9 of the
oracle in 40 updates, the limit is the model and the prompt, not exploration.

What pi is. The same distribution the local sampler draws a plan from (grammar.GrammarMask,
sampling.sampled_logprobs): the plan JSON schema of the task (bare form, the task's max_steps and
subtask length) compiled with xgrammar; text the grammar forces is written in the tokenizer's own
split and carries probability 1; at a choice (at most grammar.CHOICE_MAX allowed tokens: an
agent's name, an access list, `,` for another step or `]` to end) the model's softmax at
temperature 1 renormalised over the allowed tokens. Every allowed token of every choice is
enumerated, so pi sums to 1 over the plans, with two reductions, both printed:

- Subtasks are not enumerated: the sim ignores a subtask's wording (engine/providers/sim.py:
  only the agent, the task and what the step sees decide its answer), so each subtask is the
  fixed text `--subtask` (the schema's length: 8 characters), conditioned on, as forced tokens
  are. The decisions after it are conditioned on that text.
- One spelling per option is expanded. An option can be spelled by several token paths (`jun`
  `iper` or `j` `uniper`; `[]` or `[` `]`); every path's probability counts towards its option
  (the option's probability is exact), and the plan continues from the path with the fewest
  tokens: later decisions are read in that context, the one spelling the tokenizer itself
  writes. Without it the token tree is ~6 times larger (5,077 tokens a task on pool 1, 684
  leaves for 104 plans).

All of a task's plans run as one forward pass over the token tree (tree attention: each token
sees its ancestors, positions are depths), the prompt included, so the LoRA's effect on the
prompt is in the gradient too. The held-out tasks are evaluated the same way without a gradient:
the expected reward under pi, and the greedy plan (the most likely token at each choice, what a
greedy conductor writes), each over the oracle's; the greedy plans' shapes per kind against the
oracle's; and, for one task of each kind, the probability the policy gives each decision of the
oracle's plan (agent, access, another step, agent, access). The ratio printed against the
obvious baseline is the untrained policy's (update 0 in the same run).

The oracle warm start (`--warm-start oracle`): the upper bound of any warm start. Before the
exact-gradient updates the policy is fine-tuned, with the same LoRA, a fresh optimiser of the
trainer's family (`make_optimizer` at `--warm-lr`) and the recipe's gradient clip, to maximise

    mean over TRAINING tasks of  log pi(oracle plan | task)

each task's oracle plan (sim_structure.oracle, the plan oracle.jsonl names) written in the bare
form with each access the list of steps it sees (`[]`, `[0]`; `"all"` would be the same plan
in other words) and the fixed subtask, spelled as the tree expands it. pi of the plan is the
product of its choice probabilities renormalised over the grammar's allowed tokens, read on the
plan's own token path only (`_plan_tree.path_logprobs`: one sequence a task, the batch's
sequences as one trie so the prompt text they share runs once), not over the whole tree (that
spelling's probability: at most the plan's, which adds its other spellings). Each warm step is
one optimiser step on the next `--warm-tasks-per-step` training tasks in the interleaved order
(all of them by default); `--warm-until-fit` ends the warm start once a greedy conductor writes
every training task's oracle plan. The held-out tasks are never trained on.
**The assistance is total**: it reads the answer key (the oracle, from the sim's rules),
which no product run does (the product's warm-up, trainer/warmup.py, reads only executed,
scored runs); it measures whether
this model and adapter can hold the structure and carry it to held-out tasks when shown it,
not a method. After the warm start it reports what the updates report, plus the training
tasks' mean log pi of their oracle plan and how many of them a greedy conductor would write;
then `--updates` exact-gradient updates continue from the warm-started policy with a fresh
optimiser at the recipe's (or `--learning-rate`) rate.

The pool is shown whole and in the pool file's order (the routing recipe's per-rollout subsets
and shuffling are sampling devices; an exact objective needs none). One process, `--threads`
torch threads (1: the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import tomllib
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import torch

from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.contracts.training import (
    Recipe,
    interleave_tags,
    split_heldout,
)
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.providers.sim_structure import (
    StructuredPoolSpec,
    shape,
    structured_pool_toml,
    structured_tasks,
)
from conductor_engine.engine.tasks.files import load_tasks
from conductor_engine.trainer.grpo import make_optimizer
from conductor_engine.trainer.policy import load_policy
from tests.benchmarks._plan_tree import (
    OraclePath,
    TaskTree,
    build_tree,
    choice_logprobs,
    greedy,
    greedy_writes,
    oracle_decisions,
    oracle_path,
    path_logprobs,
    pick_logprobs,
    value,
)

ROOT = Path(__file__).resolve().parents[2]

RECIPE = ROOT / "examples" / "sim" / "recipe-plans.toml"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=1, help="the structured pool's seed")
    p.add_argument("--updates", type=int, default=40)
    p.add_argument("--recipe", default=str(RECIPE),
                   help="policy (LoRA), learning rate and gradient clip; held-out fraction")
    p.add_argument("--learning-rate", type=float, default=0.0,
                   help="0: the recipe's (AdamW, as the trainer makes it)")
    p.add_argument("--tasks-per-update", type=int, default=0,
                   help="0: every training task each update; k: the next k in the trainer's "
                   "interleaved order (the exact gradient over plans of those tasks)")
    p.add_argument("--tasks-per-kind", type=int, default=8)
    p.add_argument("--max-steps", type=int, default=0,
                   help="0: the tasks' own max_steps (2 on the generated pools)")
    p.add_argument("--subtask", default="Solve it",
                   help="every step's subtask (the sim ignores its wording)")
    p.add_argument("--precision", choices=("fp32", "bf16-mixed"), default=None,
                   help="the decoder's compute (the recipe's policy.precision; None: fp32 on a "
                   "CPU); the LM head and log-softmax stay float32, as in the trainer")
    p.add_argument("--eval-every", type=int, default=1,
                   help="evaluate the held-out tasks after every k-th update")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--stop-at", type=float, default=0.0,
                   help="stop once greedy held-out expected/oracle reaches this (0: never)")
    p.add_argument("--warm-start", choices=("none", "oracle"), default="none",
                   help="oracle: first fine-tune on the training tasks' oracle plans (total "
                   "assistance: reads the answer key; an upper bound, not a method)")
    p.add_argument("--warm-steps", type=int, default=60)
    p.add_argument("--warm-lr", type=float, default=0.0, help="0: the recipe's learning rate")
    p.add_argument("--warm-tasks-per-step", type=int, default=0,
                   help="0: every training task each warm step; k: the next k in turn")
    p.add_argument("--warm-eval-every", type=int, default=10,
                   help="evaluate the held-out tasks after every k-th warm step")
    p.add_argument("--warm-until-fit", action="store_true",
                   help="end the warm start at the first evaluation where a greedy conductor "
                   "writes the oracle plan of every training task (held-out tasks not read)")
    return p.parse_args()


# ------------------------------------------------------------------------------- the run


def evaluate(model: Any, trees: list[TaskTree]) -> dict[str, Any]:
    with torch.no_grad():
        exp, gre, orc = 0.0, 0.0, 0.0
        shapes: dict[str, Counter[str]] = defaultdict(Counter)
        exact: Counter[str] = Counter()
        odds: dict[str, list[float]] = {}
        for t in trees:
            lp = choice_logprobs(model, t)
            exp += float(value(t.root, lp))
            leaf = greedy(t.root, lp)
            gre += leaf.reward
            orc += t.oracle.expected_reward
            shapes[t.oracle.kind][shape(leaf.plan, t.parts) if leaf.plan else "invalid"] += 1
            exact[t.oracle.kind] += leaf.plan == t.oracle.plan
            if t.oracle.kind not in odds:
                odds[t.oracle.kind] = oracle_decisions(t.root, lp, t.oracle.plan)
    return {"expected": exp / orc, "greedy": gre / orc, "shapes": shapes, "exact": exact,
            "odds": odds}


def report(label: str, ev: dict[str, Any], oracle_shapes: dict[str, str], base: float,
           extra: str) -> None:
    shapes = "; ".join(
        f"{kind} ({oracle_shapes[kind]}): " + ", ".join(
            f"{s} x{n}" for s, n in sorted(c.items())) + f" [oracle plan {ev['exact'][kind]}]"
        for kind, c in ev["shapes"].items())
    odds = "; ".join(f"{k} " + " ".join(f"{p:.3g}" for p in v) for k, v in ev["odds"].items())
    ratio = ev["expected"] / base if base else 0.0
    print(f"{label}: held-out expected/oracle {ev['expected']:.3f} "
          f"(x{ratio:.2f} the untrained policy's), greedy/oracle {ev['greedy']:.3f}{extra}\n"
          f"    greedy shapes: {shapes}\n"
          f"    pi of the oracle plan's decisions (agent, access, another step, agent, "
          f"access): {odds}", flush=True)


def sft_on_oracle(model: Any, recipe: Recipe, train: list[TaskTree], held: list[TaskTree],
                  args: argparse.Namespace, oracle_shapes: dict[str, str],
                  base: float) -> None:
    """The oracle warm start: AdamW steps up the mean log pi(oracle plan | task) over the
    training tasks, `args.warm_tasks_per_step` tasks a step in the interleaved order, with the
    recipe's gradient clip; the held-out tasks evaluated every `args.warm_eval_every` steps."""
    lr = args.warm_lr or recipe.loss.learning_rate
    optimizer = make_optimizer(model, recipe.loss.model_copy(update={"learning_rate": lr}))
    params = [p for p in model.parameters() if p.requires_grad]
    paths = [oracle_path(t, args.subtask) for t in train]
    per_step = args.warm_tasks_per_step or len(paths)
    print(f"oracle warm start (TOTAL ASSISTANCE: it reads each training task's oracle plan, "
          f"the answer key no product run has; held-out tasks never): {args.warm_steps} steps "
          f"of {per_step} tasks, AdamW lr {lr}, clip {recipe.loss.max_grad_norm}; "
          f"{sum(len(p.picks) for p in paths) / len(paths):.1f} choices a plan", flush=True)
    cursor = 0
    for step in range(1, args.warm_steps + 1):
        t0 = time.monotonic()
        batch = [paths[(cursor + k) % len(paths)] for k in range(per_step)]
        cursor += per_step
        optimizer.zero_grad(set_to_none=True)
        lp = path_logprobs(model, batch)
        (-lp.mean()).backward()
        norm = float(torch.nn.utils.clip_grad_norm_(params, recipe.loss.max_grad_norm))
        if math.isfinite(norm):
            optimizer.step()
        took = time.monotonic() - t0
        line = (f"warm {step:>3}: mean log pi(oracle plan) before the step "
                f"{float(lp.detach().mean()):.3f}, grad norm {norm:.3g}, {took:.0f} s")
        if step % args.warm_eval_every and step != args.warm_steps:
            print(line, flush=True)
            continue
        print(line, flush=True)
        fit = training_fit(model, paths)
        report(f"warm {step:>3}", evaluate(model, held), oracle_shapes, base,
               f"; training tasks: mean log pi(oracle plan) {fit[0]:.3f}, greedy writes the "
               f"oracle plan on {fit[1]}/{len(paths)}")
        if args.warm_until_fit and fit[1] == len(paths):
            print(f"the warm start fits every training task's oracle plan at step {step}",
                  flush=True)
            break


def training_fit(model: Any, paths: list[OraclePath]) -> tuple[float, int]:
    """The training tasks' mean log pi of their oracle plan, and on how many of them a greedy
    conductor writes it."""
    with torch.no_grad():
        lps = pick_logprobs(model, paths)
    total = sum(float(sum(lp[k] for lp, (_, _, k) in zip(v, p.picks, strict=True)))
                for v, p in zip(lps, paths, strict=True))
    return total / len(paths), sum(greedy_writes(v, p) for v, p in zip(lps, paths, strict=True))


def main(args: argparse.Namespace) -> int:
    import xgrammar as xgr

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print("$ python " + " ".join(Path(a).name if a == sys.argv[0] else a for a in sys.argv),
          flush=True)
    recipe = Recipe.model_validate(tomllib.loads(Path(args.recipe).read_text()))
    if args.learning_rate:
        recipe = recipe.model_copy(update={"loss": recipe.loss.model_copy(
            update={"learning_rate": args.learning_rate})})
    workdir = ROOT / ".conductor" / "yardstick"
    workdir.mkdir(parents=True, exist_ok=True)
    spec = StructuredPoolSpec(seed=args.seed, tasks_per_kind=args.tasks_per_kind)
    pool_file = workdir / f"structure-{args.seed}.toml"
    pool_file.write_text(structured_pool_toml(spec))
    rows = structured_tasks(spec)
    task_file = workdir / f"structure-{args.seed}.jsonl"
    task_file.write_text("".join(json.dumps(r) + "\n" for r, _ in rows))
    oracles = {o.id: o for _, o in rows}
    tasks = load_tasks(str(task_file)).tasks
    train, held = split_heldout(tasks, recipe.heldout.fraction or 0.25, recipe.heldout.seed)
    train = interleave_tags(train, 0)
    pool = Pool.load(pool_file)

    started = time.monotonic()
    policy = load_policy(recipe.policy.model_copy(
        update={"device": "cpu", "precision": args.precision or recipe.policy.precision}))
    model, tok = policy.model, policy.tokenizer
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok),
                                              stop_token_ids=[tok.eos_token_id])
    compiler = xgr.GrammarCompiler(info, max_threads=1)

    def tree(t: Task) -> TaskTree:
        return build_tree(t, oracles[t.id], pool, spec, tok, compiler, info,
                          subtask=args.subtask, max_steps=args.max_steps)

    train_trees = [tree(t) for t in train]
    held_trees = [tree(t) for t in held]
    sizes = [len(t.tokens) - t.prompt_len for t in train_trees]
    print(f"structured pool seed {args.seed}: {len(train)} training tasks, {len(held)} held out; "
          f"{train_trees[0].plans} plans a task (pi sums to 1 over them), "
          f"{len(train_trees[0].choices)} choices, {min(sizes)}-{max(sizes)} plan-tree tokens "
          f"after a {train_trees[0].prompt_len}-token prompt; built in "
          f"{time.monotonic() - started:.0f} s", flush=True)
    oracle_shapes = {t.oracle.kind: t.oracle.shape for t in held_trees}
    params = [p for p in model.parameters() if p.requires_grad]
    per_update = args.tasks_per_update or len(train_trees)
    print(f"LoRA r={recipe.policy.lora_r}, AdamW lr {recipe.loss.learning_rate}, clip "
          f"{recipe.loss.max_grad_norm}; {per_update} tasks an update; subtask "
          f"{args.subtask!r}", flush=True)

    model.eval()  # no dropout; the gradient is exact
    base = evaluate(model, held_trees)
    report("update  0", base, oracle_shapes, base["expected"], "")
    if args.warm_start == "oracle":
        sft_on_oracle(model, recipe, train_trees, held_trees, args, oracle_shapes,
                      base["expected"])
        print("exact-gradient updates from the oracle warm start (a fresh optimiser):",
              flush=True)
    optimizer = make_optimizer(model, recipe.loss)
    cursor = 0
    for update in range(1, args.updates + 1):
        t0 = time.monotonic()
        batch = [train_trees[(cursor + k) % len(train_trees)] for k in range(per_update)]
        cursor += per_update
        optimizer.zero_grad(set_to_none=True)
        objective = 0.0
        for t in batch:
            j = value(t.root, choice_logprobs(model, t))
            (-j / len(batch)).backward()
            objective += float(j.detach())
        objective /= sum(t.oracle.expected_reward for t in batch)
        norm = float(torch.nn.utils.clip_grad_norm_(params, recipe.loss.max_grad_norm))
        if math.isfinite(norm):
            optimizer.step()
        took = time.monotonic() - t0
        if update % args.eval_every and update != args.updates:
            print(f"update {update:>2}: training expected/oracle before the step "
                  f"{objective:.3f}, grad norm {norm:.3g}, {took:.0f} s", flush=True)
            continue
        ev = evaluate(model, held_trees)
        report(f"update {update:>2}", ev, oracle_shapes, base["expected"],
               f"; training expected/oracle before the step {objective:.3f}, grad norm "
               f"{norm:.3g}, {took:.0f} s")
        if args.stop_at and ev["greedy"] >= args.stop_at:
            print(f"greedy held-out expected/oracle reached {args.stop_at} at update {update}")
            break
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
