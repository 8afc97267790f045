"""Credit per shape (trainer/grpo/_shapes.py): where a plan's shape is decided, and what the
estimator's gradient is in expectation, checked by enumerating every plan of a tiny problem
under a tiny policy (tests/tiny_policy.py: a one-layer Llama with SmolLM2's tokenizer)."""

from __future__ import annotations

import importlib.util
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conductor_engine.engine.contracts.plan_shapes import (
    Shape,
    decided,
    parse_shape,
    shape_label,
    shape_of,
    shapes,
)
from conductor_engine.engine.providers.local.shaping import consistent_tokens


def _plan(*accesses: Any) -> str:
    return json.dumps({"steps": [{"agent": "a", "subtask": 'x, "]} access":', "access": a}
                                 for a in accesses]}, separators=(",", ":"))


@pytest.mark.parametrize(("accesses", "shape"), [
    (([],), ("end",)),
    (("all",), ("end",)),
    (([], "all"), ("more", "sees", "end")),
    (([], [0]), ("more", "sees", "end")),
    (([], []), ("more", "apart", "end")),
    (([], [], [0, 1]), ("more", "apart", "more", "sees", "end")),
])
def test_a_plans_shape_is_read_off_its_text_whatever_its_subtasks_say(
        accesses: tuple[Any, ...], shape: Shape) -> None:
    """Steps and whether each later step sees an earlier one; a subtask's `,`, `]}`, quotes and
    the word access decide nothing."""
    assert shape_of(_plan(*accesses)) == shape
    steps = _plan(*accesses)[len('{"steps":'):]
    assert shape_of('{"reasoning":"a ] , [","steps":' + steps) == shape


def test_an_unfinished_plan_has_decided_only_what_it_wrote() -> None:
    text = _plan([], [0])
    at = text.rindex("[0]")
    assert shape_of(text[: at + 1]) == ("more",)  # `[` leaves the access open
    assert shape_of(text[: at + 2]) == ("more", "sees")
    d = decided(text)[1]
    assert (d.start, d.at) == (at, at + 1)


def test_every_shape_up_to_max_steps_is_listed_once_with_its_name() -> None:
    assert shapes(2) == [("end",), ("more", "sees", "end"), ("more", "apart", "end")]
    assert len(set(shapes(3))) == 7
    assert [shape_label(s) for s in shapes(2)] == ["1 step", "2 steps (sees)", "2 steps (apart)"]
    assert parse_shape("more,apart,end") == ("more", "apart", "end")
    with pytest.raises(ValueError, match="no shape outcome"):
        parse_shape("more,maybe")


def test_forcing_keeps_only_the_tokens_that_can_still_reach_the_shape() -> None:
    """`,` against `]`; an access list that must see allows `"` (all) and `[` (then a step),
    one that must not allows `[` only; a choice that decides nothing keeps all its tokens."""
    text = {1: ",", 2: "]", 3: "]}", 4: '"', 5: "[", 6: "[]"}.__getitem__
    two = _plan([], [0])
    after_first = two[: two.index("},{") + 1]
    assert consistent_tokens(after_first, [1, 2, 3], text, ("more", "sees", "end")) == [1]
    assert consistent_tokens(after_first, [1, 2, 3], text, ("end",)) == [2, 3]
    access = two[: two.rindex("[0]")]
    assert consistent_tokens(access, [4, 5, 6], text, ("more", "sees", "end")) == [4, 5]
    assert consistent_tokens(access, [4, 5, 6], text, ("more", "apart", "end")) == [5, 6]
    agent = two[: two.index('"agent":"') + 9]
    assert consistent_tokens(agent, [1, 2, 3], text, ("end",)) == [1, 2, 3]


# --------------------------------------------------------- the estimator's expectation, exact


pytorch = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "transformers")),
    reason="the local extra is not installed (pip install -e '.[local]')",
)

# A tiny problem in the plan's JSON: two agents, at most two steps; the second step's access
# is `"all"`, `[0]` or `[]`, written `"` or `[` and then `0` or `]` as the grammar writes it.
AGENTS = ("a", "b")


@dataclass
class Leaf:
    """One plan as a stratum writes it: its tokens, which were forced, the choices' allowed
    tokens (narrowed where the stratum forces its shape), and its reward."""

    ids: list[int]
    texts: list[str]
    forced: list[bool]
    choices: dict[int, list[int]]
    text: str


def _leaves(tok: Any, target: Shape | None) -> list[Leaf]:
    def enc(s: str) -> list[int]:
        return list(tok(s, add_special_tokens=False)["input_ids"])

    def one(s: str) -> int:
        ids = enc(s)
        assert len(ids) == 1, (s, ids)
        return ids[0]

    text_of = {one(s): s for s in (*AGENTS, ",", "]", '"', "[", "0")}

    # a node: ("forced", text, next) | ("choice", {token text: next}) | None (the end)
    def after_access(rest: str) -> Any:
        return ("forced", rest, None)

    second = ("forced", '{"agent":"', ("choice", {a: ("forced", '","subtask":"go","access":', (
        "choice", {'"': after_access('all"}]}'),
                   "[": ("choice", {"0": after_access("]}]}"), "]": after_access("}]}")})}))
        for a in AGENTS}))
    root = ("forced", '{"steps":[{"agent":"', ("choice", {a: ("forced",
            '","subtask":"go","access":[]}', ("choice", {",": second, "]": ("forced", "}", None)}))
            for a in AGENTS}))

    out: list[Leaf] = []

    def walk(node: Any, leaf: Leaf) -> None:
        if node is None:
            out.append(leaf)
            return
        if node[0] == "forced":
            ids = enc(node[1])
            walk(node[2], Leaf(leaf.ids + ids, leaf.texts + [tok.decode([i]) for i in ids],
                               leaf.forced + [True] * len(ids), leaf.choices,
                               leaf.text + node[1]))
            return
        options = {one(t): nxt for t, nxt in node[1].items()}
        allowed = list(options)
        if target is not None:
            allowed = consistent_tokens(leaf.text, allowed, text_of.__getitem__, target)
        for t in allowed:
            pos = len(leaf.ids)
            choices = leaf.choices if len(allowed) == 1 else {**leaf.choices, pos: allowed}
            walk(options[t], Leaf(leaf.ids + [t], leaf.texts + [text_of[t]],
                                  leaf.forced + [len(allowed) == 1], choices,
                                  leaf.text + text_of[t]))

    walk(root, Leaf([], [], [], {}, ""))
    return out


def _flat_grad(model: Any, value: Any) -> Any:
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(value, params, allow_unused=True, retain_graph=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).flatten()
                      for g, p in zip(grads, params, strict=True)])


@pytorch
@pytest.mark.parametrize("rho", [0.0, 0.5])
def test_the_shape_credit_gradient_in_expectation_is_the_stated_mix_of_exact_gradients(
        tiny_policy_dir: Path, rho: float) -> None:
    """E[g] = (1 - rho) (grad J + Delta) + rho / K sum_s grad_in J_s (trainer/grpo/_shapes.py),
    every term enumerated: the estimator's expected gradient through the trainer's own loss
    (per-token advantages, choices renormalised, forced tokens out), the group means at their
    limits (each possible rollout weighed by its probability); grad J and grad_in J_s by autograd
    of sum pi(p) R(p) over every plan; Delta from its definition. Delta is not zero: the
    estimator is not the plain policy gradient while the policy's choice of shape depends on
    the agent it chose first (here Delta is about 1% of grad J)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from conductor_engine.engine.contracts.training import LossConfig
    from conductor_engine.trainer.grpo import Sample, collate, grpo_loss, per_token_logprobs
    from conductor_engine.trainer.grpo._shapes import shape_advantages, shaped_rollout

    tok = AutoTokenizer.from_pretrained(str(tiny_policy_dir))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_policy_dir)).float()
    with torch.no_grad():  # a head that makes the choices far from uniform
        model.lm_head.weight.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(3))
    prompt = list(tok("Plan the task: which agents?", add_special_tokens=False)["input_ids"])
    rng = random.Random(7)
    reward: dict[str, float] = {}

    strata: list[tuple[Shape | None, float]] = [(None, 1.0 - rho)]
    if rho:
        strata += [(s, rho / len(shapes(2))) for s in shapes(2)]
    rows: list[tuple[Shape | None, float, Leaf]] = [
        (target, share, leaf) for target, share in strata for leaf in _leaves(tok, target)]
    for _, _, leaf in rows:
        reward.setdefault(leaf.text, round(rng.uniform(0.0, 1.0), 3))
    assert len(reward) == 2 + 2 * 2 * 3  # every plan of the problem, each with its reward

    def samples(advantages: list[list[float]] | None = None) -> list[Sample]:
        return [Sample(prompt_ids=prompt, completion_ids=leaf.ids, advantage=0.0,
                       forced=leaf.forced, choices=leaf.choices or None,
                       token_advantages=None if advantages is None else advantages[i])
                for i, (_, _, leaf) in enumerate(rows)]

    logp = per_token_logprobs(model, collate(samples(), tok.pad_token_id))  # [rows, T]
    seq = logp.sum(-1)
    prob = seq.exp().detach()
    R = torch.tensor([reward[leaf.text] for _, _, leaf in rows])
    share = torch.tensor([s for _, s, _ in rows])
    unforced = torch.tensor([t is None for t, _, _ in rows])

    # the estimator's expectation: every possible rollout weighed by share * its probability
    weight = (share * prob).tolist()
    shaped = [shaped_rollout(leaf.texts, reward[leaf.text], forced=t is not None)
              for t, _, leaf in rows]
    adv = shape_advantages(shaped, scale=False, weights=weight)
    weighted = [[w * a for a in row] for w, row in zip(weight, adv, strict=True)]
    batch = collate(samples(weighted), tok.pad_token_id)
    loss, _ = grpo_loss(per_token_logprobs(model, batch), batch, LossConfig(), normaliser=1.0)
    expected = -_flat_grad(model, loss)

    # the terms, from their definitions
    grad_j = _flat_grad(model, (seq.exp() * R)[unforced].sum())
    means: dict[Shape, float] = {}
    for r in shaped:
        for n in range(len(r.shape) + 1):
            means.setdefault(r.shape[:n], 0.0)
    for p in means:
        sel = [i for i, r in enumerate(shaped) if r.shape[: len(p)] == p]
        means[p] = sum(weight[i] * shaped[i].reward for i in sel) / sum(weight[i] for i in sel)
    delta_terms = []
    for i, r in enumerate(shaped):
        if r.forced:
            continue
        for t, own in enumerate(r.owner):
            if own is not None and not rows[i][2].forced[t]:
                delta_terms.append(prob[i] * (means[r.shape] - r.reward) * logp[i, t])
    delta = _flat_grad(model, torch.stack(delta_terms).sum())
    stated = (1 - rho) * (grad_j + delta)
    for target, s in strata[1:]:
        sel = torch.tensor([t == target for t, _, _ in rows])
        stated = stated + s * _flat_grad(model, (seq.exp() * R)[sel].sum())

    scale = grad_j.abs().max()
    assert torch.allclose(expected, stated, atol=1e-5 * scale, rtol=1e-4)
    if not rho:  # Delta is there: without it the identity would not hold
        assert (expected - grad_j).norm() > 1e-3 * grad_j.norm()


@pytorch
def test_a_forced_rollout_alone_in_its_shape_learns_and_its_expected_gradient_is_exact_in_groups(
        tiny_policy_dir: Path) -> None:
    """In a finite group, a forced rollout's expected gradient is E[c] * grad_in J_s with
    c = (n_s - 1) / n_s for n_s >= 2 rollouts of its shape and (G - 1) / G when it is alone
    (trainer/grpo/_shapes.py): every group of G = 3 enumerated (two on-policy rollouts, the
    third forced to each shape in turn), each weighed by its probability, through the trainer's
    own loss. Were a lone forced rollout credited against its own shape's mean (its own
    reward), its share (1 - pi(s))^2 of c would be zero and the identity would fail."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from conductor_engine.engine.contracts.training import LossConfig
    from conductor_engine.trainer.grpo import Sample, collate, grpo_loss, per_token_logprobs
    from conductor_engine.trainer.grpo._shapes import shape_advantages, shaped_rollout

    tok = AutoTokenizer.from_pretrained(str(tiny_policy_dir))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_policy_dir)).float()
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(3))
    prompt = list(tok("Plan the task: which agents?", add_special_tokens=False)["input_ids"])
    rng = random.Random(11)
    reward: dict[str, float] = {}
    free = _leaves(tok, None)
    for leaf in free:
        reward[leaf.text] = round(rng.uniform(0.0, 1.0), 3)

    def logps(leaves: list[Leaf], advantages: list[list[float]] | None = None) -> Any:
        batch = collate([Sample(prompt_ids=prompt, completion_ids=leaf.ids, advantage=0.0,
                                forced=leaf.forced, choices=leaf.choices or None,
                                token_advantages=None if advantages is None else advantages[i])
                         for i, leaf in enumerate(leaves)], tok.pad_token_id)
        return per_token_logprobs(model, batch), batch

    free_logp, _ = logps(free)
    pi = free_logp.sum(-1).exp().detach().tolist()
    assert sum(pi) == pytest.approx(1.0, abs=1e-5)
    free_shaped = [shaped_rollout(leaf.texts, reward[leaf.text]) for leaf in free]
    g = 3
    checked_alone = 0.0
    for target in shapes(2):
        forced = _leaves(tok, target)
        logp, _ = logps(forced)
        q = logp.sum(-1).exp().detach().tolist()  # the narrowed draw's probability
        assert sum(q) == pytest.approx(1.0, abs=1e-5)
        acc = [[0.0] * len(leaf.ids) for leaf in forced]
        for i in range(len(free)):
            for j in range(len(free)):
                for k, f in enumerate(forced):
                    group = [free_shaped[i], free_shaped[j],
                             shaped_rollout(f.texts, reward[f.text], forced=True)]
                    row = shape_advantages(group, scale=False)[2]
                    w = pi[i] * pi[j] * q[k]
                    acc[k] = [a + w * x for a, x in zip(acc[k], row, strict=True)]
        logp, batch = logps(forced, acc)
        loss, _ = grpo_loss(logp, batch, LossConfig(), normaliser=1.0)
        expected = -_flat_grad(model, loss)

        p_s = sum(p for p, r in zip(pi, free_shaped, strict=True) if r.shape == target)
        c = ((1 - p_s) ** 2 * (g - 1) / g + 2 * p_s * (1 - p_s) * (1 / 2)
             + p_s**2 * (2 / 3))
        checked_alone += (1 - p_s) ** 2
        r = torch.tensor([reward[leaf.text] for leaf in forced])
        grad_in_js = _flat_grad(model, (logp.sum(-1).exp() * r).sum())
        scale = grad_in_js.abs().max()
        assert torch.allclose(expected, c * grad_in_js, atol=1e-5 * scale, rtol=1e-4), target
    assert checked_alone > 0.5  # most groups had the forced rollout alone in its shape


# ------------------------------------------------------------------- in the trainer's groups


@pytorch
def test_a_group_credits_each_token_against_rollouts_of_its_shape(tiny_policy_dir: Path) -> None:
    """Four rollouts of a task: one step right (1.0); two steps seeing, wrong (0.25) and, forced,
    right (1.0); two steps apart, wrong (0.25). The `,` that added a wrong draft-and-review is
    credited with that shape's mean against the task's (0), not blamed with the whole wrong
    answer (-0.375); the agent inside it is measured against the two-step plans (-0.25); the
    forced rollout's every token against its shape."""
    from transformers import AutoTokenizer

    from conductor_engine.engine.contracts.agent_calls import Message
    from conductor_engine.engine.contracts.rewards import Reward, Verdict
    from conductor_engine.engine.contracts.training import RolloutConfig
    from conductor_engine.engine.rewards.rollouts import Group
    from conductor_engine.trainer.rollouts import group_samples
    from tests.traces import make_trace

    tok = AutoTokenizer.from_pretrained(str(tiny_policy_dir))
    runs = [(([],), 1.0, None), (([], "all"), 0.25, None), (([], [0]), 1.0, "more,sees,end"),
            (([], []), 0.25, None)]
    traces = []
    for i, (accesses, value, forced) in enumerate(runs):
        t = make_trace("t", reward=value)
        t.reward = Reward(value=value, reason="", verdict=Verdict(
            verifier="exact", correct=value == 1.0, score=value, reason=""))
        t.task.sampling.sample, t.task.sampling.force_shape = i, forced
        text = _plan(*accesses).replace('x, \\"]} access\\":', "go")
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
        a = t.rounds[0].attempts[0]
        a.prompt = [Message(role="user", content="Plan it.")]
        a.token_ids, a.logprobs, a.raw_text = ids, [-0.5] * len(ids), text
        traces.append(t)
    group = Group(task_id="t", policy=traces[0].policy, traces=traces, left_out=[])
    samples = group_samples(group, 0, tok, RolloutConfig(group_size=4, credit="shape",
                                                         scale_rewards=False))

    def at(sample: Any, char: str, nth: int = 0) -> float:
        """The advantage of the token holding the nth `char` after the first step's agent."""
        texts = [str(tok.decode([t])) for t in sample.completion_ids]
        ends = [sum(map(len, texts[: k + 1])) for k in range(len(texts))]
        text = "".join(texts)
        pos = text.index("}", text.index('"access"'))  # the first step's end
        for _ in range(nth + 1):
            pos = text.index(char, pos + 1)
        k = next(k for k, e in enumerate(ends) if e > pos)
        assert sample.token_advantages is not None
        return float(sample.token_advantages[k])

    def agent(sample: Any, step: int) -> float:
        texts = [str(tok.decode([t])) for t in sample.completion_ids]
        text, start = "".join(texts), -1
        for _ in range(step + 1):
            start = text.index('"agent":"', start + 1) + len('"agent":"')
        ends = [sum(map(len, texts[: k + 1])) for k in range(len(texts))]
        assert sample.token_advantages is not None
        return float(sample.token_advantages[next(k for k, e in enumerate(ends) if e > start)])

    one, sees, forced, apart = samples
    assert at(one, "]") == pytest.approx(1.0 - 0.625)  # end: b(end) - b()
    assert agent(one, 0) == pytest.approx(1.0 - 0.625)  # before any shape: R - b()
    assert at(sees, ",") == pytest.approx(0.625 - 0.625)  # more: b(its shape) - b()
    texts = [str(tok.decode([t])) for t in sees.completion_ids]
    value = "".join(texts).rindex('"access":') + len('"access":')  # the second step's: "all"
    k = next(k for k in range(len(texts)) if sum(map(len, texts[: k + 1])) > value)
    assert sees.token_advantages is not None
    assert sees.token_advantages[k] == pytest.approx(0.625 - 0.5)  # sees: b(shape) - b(more)
    assert agent(sees, 0) == pytest.approx(0.25 - 0.625)
    assert agent(sees, 1) == pytest.approx(0.25 - 0.5)  # inside two steps: R - b(more)
    assert at(apart, ",") == pytest.approx(0.25 - 0.625)
    assert forced.token_advantages == pytest.approx([1.0 - 0.625] * len(forced.completion_ids))


def test_a_recipe_refuses_shape_credit_it_cannot_give() -> None:
    """Credit per shape is within a task's group; forcing without it would credit a forced
    rollout as if its shape had been chosen."""
    from pydantic import ValidationError

    from conductor_engine.engine.contracts.training import RolloutConfig

    with pytest.raises(ValidationError, match="set baseline = 'group'"):
        RolloutConfig(credit="shape", baseline="batch")
    with pytest.raises(ValidationError, match="needs credit = 'shape'"):
        RolloutConfig(force_shapes=0.25)
    assert RolloutConfig().credit == "rollout" and RolloutConfig().force_shapes == 0.0


def test_a_forcing_recipe_is_refused_for_a_served_conductor_and_kept_for_a_local_one() -> None:
    """A served conductor's sampler cannot force a shape: a recipe that asks for it would train
    forced rollouts as free ones. Refused, saying what to do."""
    from conductor_engine.engine.contracts.training import Recipe
    from conductor_engine.engine.providers.pool import Pool
    from conductor_engine.engine.training.planning import TrainingOptions, plan_training

    def pool(provider: str, **conductor: str) -> Pool:
        return Pool.model_validate({
            "conductor": {"id": "conductor", "provider": provider, "model": "tiny", **conductor},
            "agents": [{"id": "a", "provider": "openai-compatible", "model": "m",
                        "base_url": "http://127.0.0.1:9/v1"}]})

    recipe = Recipe()
    recipe.rollouts.credit, recipe.rollouts.force_shapes = "shape", 0.5
    served = pool("openai-compatible", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match=r"force_shapes = 0.5 needs a local conductor.*"
                                         r"set force_shapes = 0"):
        plan_training(TrainingOptions(name="r", base="org/m", recipe=recipe), served, [])
    plan = plan_training(TrainingOptions(name="r", recipe=recipe), pool("local"), [])
    assert plan.recipe.rollouts.force_shapes == 0.5
