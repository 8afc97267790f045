"""The yardstick: the exact policy gradient over every plan, on a structured sim pool.

    python -m tests.benchmarks.bench_exact_gradient [--seed 1] [--updates 40]
        [--recipe examples/sim/recipe-plans.toml] [--tasks-per-update 0] [--subtask "Solve it"]
        [--threads 1]

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

The pool is shown whole and in the pool file's order (the routing recipe's per-rollout subsets
and shuffling are sampling devices; an exact objective needs none). One process, `--threads`
torch threads (1: the machine is shared).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
import tomllib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.contracts.training import (
    Recipe,
    interleave_tags,
    split_heldout,
)
from conductor_engine.engine.plan.language import (
    PlanError,
    parse_plan,
    plan_json_schema,
)
from conductor_engine.engine.plan.prompts import conductor_messages
from conductor_engine.engine.providers.local.chat import render_chat
from conductor_engine.engine.providers.local.grammar import CHOICE_MAX
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.providers.sim_structure import (
    Oracle,
    PlanStep,
    StructuredPoolSpec,
    expected_reward,
    shape,
    structured_pool_toml,
    structured_tasks,
)
from conductor_engine.engine.tasks.files import load_tasks
from conductor_engine.trainer.grpo import compute_of, make_optimizer
from conductor_engine.trainer.policy import load_policy

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
    return p.parse_args()


# ------------------------------------------------------------------------- the plan tree


@dataclass
class Choice:
    """A point where the grammar leaves a choice: the logits of trie node `ctx` renormalised
    over `allowed`; `children[i]` follows `allowed[i]`: a Choice within the same option (the
    `0` or `]` after `[`), or a Branch once the option is resolved."""

    ctx: int
    allowed: list[int]
    children: list[Choice | Branch] = field(default_factory=list)
    index: int = -1  # its row among the tree's choices


@dataclass
class Branch:
    """A resolved option (the text up to the next choice, `text`) and what follows it,
    expanded once from its shortest spelling: the next decision, or the plan's end (`leaf`)."""

    text: str
    next: Choice | None = None
    leaf: Leaf | None = None


@dataclass
class Leaf:
    text: str
    plan: list[PlanStep] | None
    reward: float


class TreeBuilder:
    """Every plan of one prompt, as a token trie walked with the task's xgrammar matcher the
    way grammar.GrammarMask walks it (forced text in the tokenizer's split, one token at a time;
    free text replaced by the fixed subtask)."""

    def __init__(self, tokenizer: Any, compiled: Any, info: Any, subtask: str,
                 score: Any) -> None:
        import xgrammar as xgr

        self.tok = tokenizer
        self.matcher = xgr.GrammarMatcher(compiled)  # rollback is unbounded
        self.vocab = int(info.vocab_size)
        self.stop = set(info.stop_token_ids)
        self.bitmask = xgr.allocate_token_bitmask(1, self.vocab)
        self.subtask = self.encode(subtask)
        self.score = score  # plan text -> Leaf
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.children: dict[tuple[int, int], int] = {}
        self.choices: list[Choice] = []
        self._bits = torch.arange(32, dtype=torch.int32)

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def node(self, parent: int, token: int) -> int:
        key = (parent, token)
        if key not in self.children:
            self.children[key] = len(self.tokens)
            self.tokens.append(token)
            self.parents.append(parent)
        return self.children[key]

    def build(self, prompt: list[int]) -> Choice | Branch:
        at = -1
        for t in prompt:
            at = self.node(at, t)
        return self._expand(at, [])

    # the matcher's next move: ("forced", token) | ("free", None) | ("end", None) |
    # ("choice", allowed)
    def _next(self) -> tuple[str, Any]:
        m = self.matcher
        if m.is_terminated():
            return "end", None
        jump = m.find_jump_forward_string()
        m.fill_next_token_bitmask(self.bitmask, 0)
        words = self.bitmask[0]
        if jump:
            first = self.encode(jump)[0]
            if (int(words[first // 32]) >> (first % 32)) & 1:
                return "forced", first
        allowed = ((words[:, None] >> self._bits) & 1).flatten()[: self.vocab].nonzero()
        ids = [int(t) for t in allowed[:, 0].tolist()]
        if len(ids) == 1:
            return ("end", None) if ids[0] in self.stop else ("forced", ids[0])
        if len(ids) > CHOICE_MAX:
            return "free", None
        return "choice", [t for t in ids if t not in self.stop]

    def _accept(self, token: int) -> None:
        if not self.matcher.accept_token(token):
            raise RuntimeError(f"the plan grammar rejected token {token}")

    def _expand(self, at: int, text: list[int]) -> Choice | Branch:
        """From trie node `at` (plan tokens so far `text`): follow forced text, then the next
        decision (a Choice) or the plan's end (a Branch with its Leaf)."""
        accepted = 0
        try:
            while True:
                kind, value = self._next()
                if kind == "forced":
                    self._accept(value)
                    accepted += 1
                    at = self.node(at, value)
                    text.append(value)
                elif kind == "free":
                    for t in self.subtask:
                        self._accept(t)
                        accepted += 1
                        at = self.node(at, t)
                        text.append(t)
                elif kind == "end":
                    plan_text = self.tok.decode(text)
                    return Branch(text=plan_text, leaf=self.score(plan_text))
                else:
                    return self._decision(at, text, value)
        finally:
            if accepted:
                self.matcher.rollback(accepted)
                del text[len(text) - accepted:]

    def _decision(self, at: int, text: list[int], allowed: list[int]) -> Choice:
        """A decision: every token path until the option is resolved (the next move forced or
        free, or the end), grouped by the text they resolve to; each group expanded once."""
        branches: dict[str, Branch] = {}
        spellings: dict[str, tuple[int, list[int]]] = {}  # resolved text -> shortest path

        def walk(ctx: int, allowed: list[int], path: list[int]) -> Choice:
            choice = Choice(ctx=ctx, allowed=allowed)
            self.choices.append(choice)
            for t in allowed:
                self._accept(t)
                path.append(t)
                kind, value = self._next()
                if kind == "choice":
                    child = self.node(ctx, t)
                    choice.children.append(walk(child, value, path))
                else:
                    key = self._resolved(text + path)
                    if key not in branches:
                        branches[key] = Branch(text=key)
                    if key not in spellings or len(path) < len(spellings[key][1]):
                        spellings[key] = (len(path), list(path))
                    choice.children.append(branches[key])
                path.pop()
                self.matcher.rollback(1)
            return choice

        root = walk(at, allowed, [])
        for key, (_, path) in spellings.items():
            node = at
            for t in path:
                self._accept(t)
                node = self.node(node, t)
            follow = self._expand(node, text + path)
            self.matcher.rollback(len(path))
            if isinstance(follow, Choice):
                branches[key].next = follow
            else:
                branches[key].leaf = follow.leaf
        return root

    def _resolved(self, text: list[int]) -> str:
        """The plan text once the forced text after `text` is written (up to the next choice,
        free text or the end): what identifies an option, whatever its spelling."""
        accepted = 0
        extra: list[int] = []
        while True:
            kind, value = self._next()
            if kind != "forced":
                break
            self._accept(value)
            accepted += 1
            extra.append(value)
        if accepted:
            self.matcher.rollback(accepted)
        return str(self.tok.decode(text + extra))


@dataclass
class TaskTree:
    task: Task
    oracle: Oracle
    parts: list[str]
    root: Choice | Branch
    tokens: list[int]
    parents: list[int]
    choices: list[Choice]
    prompt_len: int
    plans: int = 0


def build_tree(task: Task, oracle: Oracle, pool: Pool, spec: StructuredPoolSpec,
               tokenizer: Any, compiler: Any, info: Any, *, subtask: str = "Solve it",
               max_steps: int = 0) -> TaskTree:
    """Every plan of `task` as the conductor would write it for `pool` (the whole pool, in
    its order), each leaf scored with the sim's expected reward."""
    agents = pool.available()
    ids = [a.id for a in agents]
    parts = task.parts or task.tags
    max_steps = max_steps or task.options.max_steps
    messages = conductor_messages(task.question, agents, max_steps=max_steps, json_mode=True)
    prompt = list(tokenizer(render_chat(tokenizer, messages),
                            add_special_tokens=False)["input_ids"])
    schema = plan_json_schema(ids, max_steps, subtask_max_chars=task.options.subtask_max_chars)
    compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
    roles = spec.agents()
    seen: set[str] = set()

    def score(text: str) -> Leaf:
        seen.add(text)
        try:
            plan = parse_plan(text, ids, max_steps=max_steps)
        except PlanError:
            return Leaf(text=text, plan=None, reward=0.0)
        steps = [PlanStep(agent=s.agent, sees=s.sees(i)) for i, s in enumerate(plan.steps)]
        value, _, _ = expected_reward(steps, roles, parts, spec.wrong, spec.cost_penalty_per_usd)
        return Leaf(text=text, plan=steps, reward=value)

    b = TreeBuilder(tokenizer, compiled, info, subtask, score)
    root = b.build(prompt)
    for i, c in enumerate(b.choices):
        c.index = i
    return TaskTree(task=task, oracle=oracle, parts=parts, root=root, tokens=b.tokens,
                    parents=b.parents, choices=b.choices, prompt_len=len(prompt),
                    plans=len(seen))


# ------------------------------------------------------------------------- the objective


def choice_logprobs(model: Any, tree: TaskTree) -> list[torch.Tensor]:
    """log pi(token | context) at every choice of the tree, over its allowed tokens: one
    forward pass over the whole token trie (each token attends to its ancestors)."""
    n = len(tree.tokens)
    depth = [0] * n
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(tree.parents):
        if p >= 0:
            depth[i] = depth[p] + 1
            mask[i] = mask[p]
        mask[i, i] = True
    bias = torch.zeros(n, n).masked_fill_(~mask, torch.finfo(torch.float32).min)
    ids = torch.tensor([tree.tokens])
    causal = model.get_base_model() if hasattr(model, "get_base_model") else model
    dtype = compute_of(model).autocast
    # the decoder stack alone (its last hidden state is after the final norm), the LM head
    # only where a choice is read (the head is a fifth of the model at 49k tokens), in float32
    with torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext():
        h = causal.model(input_ids=ids, attention_mask=bias[None, None],
                         position_ids=torch.tensor([depth])).last_hidden_state[0]
    head = causal.get_output_embeddings()
    ctx = torch.tensor([c.ctx for c in tree.choices])
    logits = head(h[ctx].float()).float()
    return [torch.log_softmax(logits[k, c.allowed], dim=-1) for k, c in enumerate(tree.choices)]


def value(node: Choice | Branch, lp: list[torch.Tensor],
          memo: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
    """E[reward] under pi from this point: sum over options of pi(option) * its value (a
    branch reached by several spellings is valued once)."""
    memo = {} if memo is None else memo
    if id(node) in memo:
        return memo[id(node)]
    if isinstance(node, Branch):
        if node.leaf is not None:
            out = torch.tensor(node.leaf.reward)
        else:
            assert node.next is not None
            out = value(node.next, lp, memo)
    else:
        values = torch.stack([value(child, lp, memo) for child in node.children])
        out = (lp[node.index].exp() * values).sum()
    memo[id(node)] = out
    return out


def plan_probabilities(node: Choice | Branch, lp: list[torch.Tensor], p: float = 1.0,
                       out: dict[str, float] | None = None) -> dict[str, float]:
    """pi of every plan text under `node` (they sum to 1 from the root)."""
    out = {} if out is None else out
    if isinstance(node, Branch):
        if node.leaf is not None:
            out[node.leaf.text] = out.get(node.leaf.text, 0.0) + p
        else:
            assert node.next is not None
            plan_probabilities(node.next, lp, p, out)
        return out
    probs = lp[node.index].exp().tolist()
    for q, child in zip(probs, node.children, strict=True):
        plan_probabilities(child, lp, p * q, out)
    return out


def greedy(node: Choice | Branch, lp: list[torch.Tensor]) -> Leaf:
    """The plan a greedy conductor writes: the most likely token at every choice."""
    while True:
        if isinstance(node, Branch):
            if node.leaf is not None:
                return node.leaf
            assert node.next is not None
            node = node.next
        else:
            node = node.children[int(lp[node.index].argmax())]


def leaves_under(node: Choice | Branch) -> list[Leaf]:
    if isinstance(node, Branch):
        if node.leaf is not None:
            return [node.leaf]
        assert node.next is not None
        return leaves_under(node.next)
    return [leaf for c in node.children for leaf in leaves_under(c)]


def oracle_decisions(root: Choice | Branch, lp: list[torch.Tensor], best: list[PlanStep]
                     ) -> list[float]:
    """pi of each decision of the oracle's plan, given the ones before: at each decision the
    mass of the options that still lead to the oracle's plan (step 0's `"all"` and `[]` both
    see nothing; step 1's `"all"` and `[0]` both see step 0), then on along the likeliest."""
    out: list[float] = []
    node: Choice | Branch | None = root
    while node is not None:
        if isinstance(node, Branch):
            node = node.next
            continue
        mass: dict[int, tuple[float, Branch]] = {}
        _options_to(node, lp, best, 1.0, mass)
        if not mass:
            break
        out.append(sum(p for p, _ in mass.values()))
        node = max(mass.values(), key=lambda pb: pb[0])[1]
    return out


def _options_to(c: Choice | Branch, lp: list[torch.Tensor], best: list[PlanStep], p: float,
                mass: dict[int, tuple[float, Branch]]) -> None:
    """Add to `mass` each option of the decision at `c` that leads to `best`, with pi of it."""
    if isinstance(c, Branch):
        if any(leaf.plan == best for leaf in leaves_under(c)):
            mass[id(c)] = (mass.get(id(c), (0.0, c))[0] + p, c)
        return
    probs = lp[c.index].exp().tolist()
    for q, child in zip(probs, c.children, strict=True):
        _options_to(child, lp, best, p * q, mass)


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


def report(update: int, ev: dict[str, Any], oracle_shapes: dict[str, str], base: float,
           extra: str) -> None:
    shapes = "; ".join(
        f"{kind} ({oracle_shapes[kind]}): " + ", ".join(
            f"{s} x{n}" for s, n in sorted(c.items())) + f" [oracle plan {ev['exact'][kind]}]"
        for kind, c in ev["shapes"].items())
    odds = "; ".join(f"{k} " + " ".join(f"{p:.3g}" for p in v) for k, v in ev["odds"].items())
    ratio = ev["expected"] / base if base else 0.0
    print(f"update {update:>2}: held-out expected/oracle {ev['expected']:.3f} "
          f"(x{ratio:.2f} the untrained policy's), greedy/oracle {ev['greedy']:.3f}{extra}\n"
          f"    greedy shapes: {shapes}\n"
          f"    pi of the oracle plan's decisions (agent, access, another step, agent, "
          f"access): {odds}", flush=True)


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
    optimizer = make_optimizer(model, recipe.loss)
    params = [p for p in model.parameters() if p.requires_grad]
    per_update = args.tasks_per_update or len(train_trees)
    print(f"LoRA r={recipe.policy.lora_r}, AdamW lr {recipe.loss.learning_rate}, clip "
          f"{recipe.loss.max_grad_norm}; {per_update} tasks an update; subtask "
          f"{args.subtask!r}", flush=True)

    model.eval()  # no dropout; the gradient is exact
    base = evaluate(model, held_trees)
    report(0, base, oracle_shapes, base["expected"], "")
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
        report(update, ev, oracle_shapes, base["expected"],
               f"; training expected/oracle before the step {objective:.3f}, grad norm "
               f"{norm:.3g}, {took:.0f} s")
        if args.stop_at and ev["greedy"] >= args.stop_at:
            print(f"greedy held-out expected/oracle reached {args.stop_at} at update {update}")
            break
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
