"""The plan tree of tests/benchmarks/bench_exact_gradient.py (the yardstick): every plan the
conductor could write for a task under the plan grammar, as a token trie, with pi read from the
policy in one tree-attention pass; the objective (the expected reward under pi) and what is read
from the tree (greedy plan, pi of the oracle plan's decisions); and the oracle plan's own token
path (`oracle_path`, `path_logprobs`), the sequence the oracle warm start fine-tunes on. What pi
is and the tree's two reductions: bench_exact_gradient's docstring.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from conductor_engine.engine.contracts.tasks import Task
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
)
from conductor_engine.trainer.grpo import compute_of

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
    spelling: list[int] = field(default_factory=list)  # the token path it was expanded from


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
            branches[key].spelling = path
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
    roles = spec.agents()
    parts = task.parts or task.tags

    def worth(steps: list[PlanStep]) -> float:
        return expected_reward(steps, roles, parts, spec.wrong, spec.cost_penalty_per_usd)[0]

    return scored_tree(task, oracle, pool, worth, tokenizer, compiler, info, subtask=subtask,
                       max_steps=max_steps)


def scored_tree(task: Task, oracle: Oracle, pool: Pool, worth: Callable[[list[PlanStep]], float],
                tokenizer: Any, compiler: Any, info: Any, *, subtask: str = "Solve it",
                max_steps: int = 0) -> TaskTree:
    """`build_tree` with the leaves scored by `worth` (a plan's expected reward): the routing
    yardstick (bench_routing_yardstick) scores a plan by its agent's skill at the task's tag."""
    agents = pool.available()
    ids = [a.id for a in agents]
    parts = task.parts or task.tags
    max_steps = max_steps or task.options.max_steps
    messages = conductor_messages(task.question, agents, max_steps=max_steps, json_mode=True)
    prompt = list(tokenizer(render_chat(tokenizer, messages),
                            add_special_tokens=False)["input_ids"])
    schema = plan_json_schema(ids, max_steps, subtask_max_chars=task.options.subtask_max_chars)
    compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
    seen: set[str] = set()

    def score(text: str) -> Leaf:
        seen.add(text)
        try:
            plan = parse_plan(text, ids, max_steps=max_steps)
        except PlanError:
            return Leaf(text=text, plan=None, reward=0.0)
        steps = [PlanStep(agent=s.agent, sees=s.sees(i)) for i, s in enumerate(plan.steps)]
        return Leaf(text=text, plan=steps, reward=worth(steps))

    b = TreeBuilder(tokenizer, compiled, info, subtask, score)
    root = b.build(prompt)
    for i, c in enumerate(b.choices):
        c.index = i
    return TaskTree(task=task, oracle=oracle, parts=parts, root=root, tokens=b.tokens,
                    parents=b.parents, choices=b.choices, prompt_len=len(prompt),
                    plans=len(seen))


# ------------------------------------------------------------------------- the objective


def tree_hidden(model: Any, tokens: list[int], parents: list[int]) -> torch.Tensor:
    """The decoder's last hidden state (after the final norm) at every token of a token trie,
    in one forward pass: each token attends to its ancestors, its position is its depth."""
    n = len(tokens)
    depth = [0] * n
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            depth[i] = depth[p] + 1
            mask[i] = mask[p]
        mask[i, i] = True
    bias = torch.zeros(n, n).masked_fill_(~mask, torch.finfo(torch.float32).min)
    ids = torch.tensor([tokens])
    causal = model.get_base_model() if hasattr(model, "get_base_model") else model
    dtype = compute_of(model).autocast
    # the decoder stack alone, in the recipe's compute; the LM head is applied by the callers
    # only where a choice is read (the head is a fifth of the model at 49k tokens), in float32
    with torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext():
        h = causal.model(input_ids=ids, attention_mask=bias[None, None],
                         position_ids=torch.tensor([depth])).last_hidden_state[0]
    return h


def _head(model: Any, h: torch.Tensor) -> torch.Tensor:
    causal = model.get_base_model() if hasattr(model, "get_base_model") else model
    return causal.get_output_embeddings()(h.float()).float()


def choice_logprobs(model: Any, tree: TaskTree) -> list[torch.Tensor]:
    """log pi(token | context) at every choice of the tree, over its allowed tokens: one
    forward pass over the whole token trie (each token attends to its ancestors)."""
    h = tree_hidden(model, tree.tokens, tree.parents)
    logits = _head(model, h[torch.tensor([c.ctx for c in tree.choices])])
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


# ------------------------------------------------------------------------- the oracle's path


def oracle_text(plan: list[PlanStep], subtask: str) -> str:
    """The oracle's plan as the bare JSON form writes it: each step's access the list of
    earlier steps it sees (`[]`, `[0]`), never the equivalent `"all"`."""
    steps = [{"agent": s.agent, "subtask": subtask, "access": s.sees} for s in plan]
    return json.dumps({"steps": steps})  # the separators the grammar writes: ", " and ": "


@dataclass
class OraclePath:
    """One plan's token path through a task's tree: `tokens` run from the prompt's first token
    to the context of the plan's last choice (positions 0..n-1), and `picks` holds, for each
    choice on the way, the position of its context, the tokens the grammar allows there and
    the index of the one the plan writes. Forced and subtask tokens lie between, conditioned
    on (probability 1, as in the tree)."""

    text: str
    tokens: list[int]
    picks: list[tuple[int, list[int], int]]


def oracle_path(tree: TaskTree, subtask: str = "Solve it") -> OraclePath:
    """The oracle plan's path in the tree, spelled as the tree expands it (each option's
    shortest token path, the tokenizer's own split), so each pick's context is the one the tree
    reads: log pi of the path is the sum over picks of the tree's choice log-probs."""
    target = oracle_text(tree.oracle.plan, subtask)
    picks: list[tuple[Choice, int]] = []
    node: Choice | Branch = tree.root
    while True:
        if isinstance(node, Branch):
            if node.leaf is not None:
                break
            assert node.next is not None
            node = node.next
            continue
        options: list[Branch] = []
        _branches(node, options)
        on = [b for b in options if any(leaf.text == target for leaf in leaves_under(b))]
        if len(on) != 1:
            raise ValueError(f"the tree of {tree.task.id} has {len(on)} options on the way to "
                             f"its oracle plan {target!r} (a plan of the tree: "
                             f"{leaves_under(node)[0].text!r}): is the subtask the tree's?")
        at: Choice | Branch = node
        for t in on[0].spelling:
            assert isinstance(at, Choice)
            k = at.allowed.index(t)
            picks.append((at, k))
            at = at.children[k]
        assert at is on[0]
        node = on[0]
    chain: list[int] = []
    at_node = picks[-1][0].ctx
    while at_node >= 0:
        chain.append(at_node)
        at_node = tree.parents[at_node]
    chain.reverse()
    position = {n: i for i, n in enumerate(chain)}
    return OraclePath(text=target, tokens=[tree.tokens[n] for n in chain],
                      picks=[(position[c.ctx], c.allowed, k) for c, k in picks])


def _branches(c: Choice | Branch, out: list[Branch]) -> None:
    """The options of the decision at `c` (the Branches its token paths resolve to), once."""
    if isinstance(c, Branch):
        if all(b is not c for b in out):
            out.append(c)
        return
    for child in c.children:
        _branches(child, out)


def pick_logprobs(model: Any, paths: list[OraclePath]) -> list[list[torch.Tensor]]:
    """log pi over the allowed tokens at each pick of each path, all paths in one forward pass
    over their shared trie: the prompt text the tasks share (the system message, the pool) is
    computed once."""
    tokens: list[int] = []
    parents: list[int] = []
    nodes: dict[tuple[int, int], int] = {}
    where: list[list[int]] = []  # each path's positions as trie nodes
    for path in paths:
        at, mine = -1, []
        for t in path.tokens:
            if (at, t) not in nodes:
                nodes[(at, t)] = len(tokens)
                tokens.append(t)
                parents.append(at)
            at = nodes[(at, t)]
            mine.append(at)
        where.append(mine)
    h = tree_hidden(model, tokens, parents)
    ctx = [where[i][pos] for i, path in enumerate(paths) for pos, _, _ in path.picks]
    logits = _head(model, h[torch.tensor(ctx)])
    out: list[list[torch.Tensor]] = []
    row = 0
    for path in paths:
        out.append([torch.log_softmax(logits[row + j, allowed], dim=-1)
                    for j, (_, allowed, _) in enumerate(path.picks)])
        row += len(path.picks)
    return out


def path_logprobs(model: Any, paths: list[OraclePath]) -> torch.Tensor:
    """log pi of each path: the sum of its picks' log-probs, each renormalised over the tokens
    the grammar allows there (forced and subtask tokens have probability 1)."""
    lps = pick_logprobs(model, paths)
    return torch.stack([sum((lp[k] for lp, (_, _, k) in zip(v, path.picks, strict=True)),
                            torch.zeros(())) for v, path in zip(lps, paths, strict=True)])


def greedy_writes(lps: list[torch.Tensor], path: OraclePath) -> bool:
    """Whether a greedy conductor writes the path: its token the likeliest at every pick."""
    return all(int(lp.argmax()) == k for lp, (_, _, k) in zip(lps, path.picks, strict=True))
