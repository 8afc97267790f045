"""The yardstick's plan tree (tests/benchmarks/_plan_tree.py, run by bench_exact_gradient.py):
every plan the grammar allows, with the probability the policy gives it, read in one
tree-attention pass; and the oracle plan's own token path, which the oracle warm start trains
on. Against a
one-layer conductor with SmolLM2's tokenizer (tests/tiny_policy.py), the real plan grammar and
the pool of `conductor sim pool --structure --seed 1`."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None
        for m in ("torch", "transformers", "gguf", "xgrammar", "peft")),
    reason="the local extra is not installed (pip install -e '.[local]')",
)


def _trees(model_dir: Path, tmp_path: Path, kinds: tuple[str, ...]) -> tuple[Any, list[Any]]:
    import xgrammar as xgr

    from conductor_engine.engine.contracts.training import PolicyConfig
    from conductor_engine.engine.providers.pool import Pool
    from conductor_engine.engine.providers.sim_structure import (
        StructuredPoolSpec,
        structured_pool_toml,
        structured_tasks,
    )
    from conductor_engine.engine.tasks.files import load_tasks
    from conductor_engine.trainer.policy import load_policy
    from tests.benchmarks._plan_tree import build_tree

    spec = StructuredPoolSpec(seed=1, tasks_per_kind=1)
    (tmp_path / "pool.toml").write_text(structured_pool_toml(spec))
    rows = structured_tasks(spec)
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r, _ in rows))
    oracles = {o.id: o for _, o in rows}
    tasks = [t for t in load_tasks(str(tmp_path / "tasks.jsonl")).tasks
             if oracles[t.id].kind in kinds]
    policy = load_policy(PolicyConfig(base=str(model_dir), device="cpu"))
    tok = policy.tokenizer
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok),
                                              stop_token_ids=[tok.eos_token_id])
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    pool = Pool.load(tmp_path / "pool.toml")
    return policy, [build_tree(t, oracles[t.id], pool, spec, tok, compiler, info)
                    for t in tasks]


def test_the_tree_holds_every_plan_once_and_pi_sums_to_one_over_them(
    tiny_policy_dir: Path, tmp_path: Path,
) -> None:
    """Four agents, two steps: 4 x 2 first steps (`"all"` or `[]`), each alone or followed by
    4 x 3 second steps (`"all"`, `[]`, `[0]`): 104 plans, every one parsed and scored, whose
    probabilities add up to 1 (every spelling of an option counted), and the oracle's among
    them with the oracle's expected reward."""
    import torch

    from tests.benchmarks._plan_tree import (
        choice_logprobs,
        leaves_under,
        oracle_decisions,
        plan_probabilities,
        value,
    )

    policy, (tree,) = _trees(tiny_policy_dir, tmp_path, ("split",))
    with torch.no_grad():
        lp = choice_logprobs(policy.model, tree)
    probs = plan_probabilities(tree.root, lp)
    assert len(probs) == tree.plans == 104
    assert sum(probs.values()) == pytest.approx(1.0, abs=1e-5)
    leaves = {leaf.text: leaf for leaf in leaves_under(tree.root)}
    assert all(leaf.plan is not None for leaf in leaves.values())
    best = [leaf for leaf in leaves.values() if leaf.plan == tree.oracle.plan]
    assert best and all(leaf.reward == pytest.approx(tree.oracle.expected_reward, abs=1e-6)
                        for leaf in best)
    # the oracle plan's five decisions (agent, access, another step, agent, access); the
    # first is the marginal pi of the oracle's first agent over all plans
    odds = oracle_decisions(tree.root, lp, tree.oracle.plan)
    assert len(odds) == 5 and all(0 < p <= 1 + 1e-6 for p in odds)
    first = tree.oracle.plan[0].agent
    assert odds[0] == pytest.approx(sum(p for text, p in probs.items()
                                        if (leaves[text].plan or [])[0].agent == first), abs=1e-5)
    expected = sum(p * leaves[text].reward for text, p in probs.items())
    assert float(value(tree.root, lp)) == pytest.approx(expected, abs=1e-5)


def test_tree_attention_gives_each_choice_the_log_probs_of_a_plain_forward_pass(
    tiny_policy_dir: Path, tmp_path: Path,
) -> None:
    """Each choice's distribution, read from the one pass over the token tree, is what the
    model gives the same tokens run alone (the context's ancestors only, positions 0..n)."""
    import torch

    from tests.benchmarks._plan_tree import choice_logprobs

    policy, (tree,) = _trees(tiny_policy_dir, tmp_path, ("review",))
    model = policy.model.get_base_model()
    with torch.no_grad():
        lp = choice_logprobs(policy.model, tree)
        for c in tree.choices[:: max(len(tree.choices) // 12, 1)]:
            seq, at = [], c.ctx
            while at >= 0:
                seq.append(tree.tokens[at])
                at = tree.parents[at]
            logits = model(input_ids=torch.tensor([seq[::-1]])).logits[0, -1].float()
            alone = torch.log_softmax(logits[c.allowed], dim=-1)
            assert torch.allclose(lp[c.index], alone, atol=1e-4), c.allowed


def test_a_step_up_the_exact_gradient_raises_the_expected_reward(
    tiny_policy_dir: Path, tmp_path: Path,
) -> None:
    """The objective is differentiable through the LoRA policy, and one small step of the
    trainer's optimiser on its gradient raises it."""
    import torch

    from conductor_engine.engine.contracts.training import LossConfig
    from conductor_engine.trainer.grpo import make_optimizer
    from tests.benchmarks._plan_tree import choice_logprobs, value

    policy, trees = _trees(tiny_policy_dir, tmp_path, ("one", "generalist"))
    model = policy.model
    optimizer = make_optimizer(model, LossConfig(learning_rate=1e-3))

    def objective() -> torch.Tensor:
        return sum((value(t.root, choice_logprobs(model, t)) for t in trees),
                   torch.tensor(0.0)) / len(trees)

    before = objective()
    (-before).backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0
               for p in model.parameters() if p.requires_grad)
    optimizer.step()
    with torch.no_grad():
        after = objective()
    assert float(after) > float(before.detach())


def test_the_oracle_path_log_prob_is_the_trees_product_over_its_picks(
    tiny_policy_dir: Path, tmp_path: Path,
) -> None:
    """log pi of the oracle plan read on its own token path (one sequence per task, batched as
    one trie) equals the sum of the tree's log-probs at the choices of that path, for a one-
    and a two-step oracle, and is at most the tree's probability of the plan text (which adds
    every spelling); a greedy-writes verdict agrees with the tree's greedy plan. A wrong
    position, a softmax over the whole vocabulary or a missed choice fails it."""
    import torch

    from tests.benchmarks._plan_tree import (
        Branch,
        Choice,
        choice_logprobs,
        greedy,
        greedy_writes,
        oracle_path,
        path_logprobs,
        pick_logprobs,
        plan_probabilities,
    )

    policy, trees = _trees(tiny_policy_dir, tmp_path, ("one", "split"))
    assert [len(t.oracle.plan) for t in trees] == [1, 2]
    paths = [oracle_path(t) for t in trees]
    # one step: agent, access, the end; two steps: five decisions, `[0]` read as `[`,`0`
    assert [len(p.picks) for p in paths] == [3, 6]
    with torch.no_grad():
        together = path_logprobs(policy.model, paths)
        alone = torch.cat([path_logprobs(policy.model, [p]) for p in paths])
        picks = pick_logprobs(policy.model, paths)
        for tree, path, got, lps in zip(trees, paths, together, picks, strict=True):
            lp = choice_logprobs(policy.model, tree)
            # the tree's product along the same picks, walked from the root
            want, node, k = 0.0, tree.root, 0
            while not (isinstance(node, Branch) and node.leaf is not None):
                if isinstance(node, Branch):
                    node = node.next
                    continue
                assert isinstance(node, Choice)
                pos, allowed, pick = path.picks[k]
                assert allowed == node.allowed and path.tokens[pos] == tree.tokens[node.ctx]
                want += float(lp[node.index][pick])
                node, k = node.children[pick], k + 1
            assert k == len(path.picks)
            assert node.leaf.plan == tree.oracle.plan and node.leaf.text == path.text
            assert float(got) == pytest.approx(want, abs=1e-4)
            assert float(got) < -1e-3  # a real distribution, not a forced path
            assert math.exp(float(got)) <= plan_probabilities(tree.root, lp)[path.text] + 1e-6
            assert greedy_writes(lps, path) == (greedy(tree.root, lp).text == path.text)
        assert torch.allclose(together, alone, atol=1e-4)
