"""The routing yardstick (tests/benchmarks/bench_routing_yardstick.py): a generated routing
pool's plan trees, scored by the skill matrix, and the fine-tune on the competent agents.
Against a one-layer conductor with SmolLM2's tokenizer (tests/tiny_policy.py) and the pool of
`conductor sim pool --seed 27`."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None
        for m in ("torch", "transformers", "gguf", "xgrammar", "peft")),
    reason="the local extra is not installed (pip install -e '.[local]')",
)


def test_each_routing_plan_is_worth_its_agents_skill_and_the_oracle_is_the_competent_agent(
    tiny_policy_dir: Path, tmp_path: Path,
) -> None:
    """Every plan of a routing task is one step (an agent, with `[]` or `"all"` access), worth
    the agent's skill at the task's tag; the oracle plan is the tag's competent agent; and a
    few fine-tune steps on the oracle plans raise their log pi on the training tasks."""
    import torch
    import xgrammar as xgr

    from conductor_engine.engine.contracts.training import PolicyConfig, Recipe
    from conductor_engine.engine.providers.sim_pool import SimPoolSpec
    from conductor_engine.trainer.policy import load_policy
    from tests.benchmarks._plan_tree import leaves_under, oracle_path, path_logprobs
    from tests.benchmarks.bench_routing_yardstick import fine_tune, pool_trees, routed

    torch.manual_seed(0)
    policy = load_policy(PolicyConfig(base=str(tiny_policy_dir), device="cpu", lora=True))
    tok = policy.tokenizer
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok),
                                              stop_token_ids=[tok.eos_token_id])
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    recipe = Recipe()
    train, held, right = pool_trees(27, recipe, tok, compiler, info, "Solve it", tmp_path)
    assert (len(train), len(held)) == (24, 8)
    matrix = SimPoolSpec(seed=27).skill_matrix()
    for t in train + held:
        leaves = leaves_under(t.root)
        assert {leaf.plan[0].agent for leaf in leaves if leaf.plan} == set(matrix)
        for leaf in leaves:
            assert leaf.plan is not None and len(leaf.plan) == 1
            assert leaf.reward == matrix[leaf.plan[0].agent][t.task.tags[0]]
        assert right[t.task.id] == {t.oracle.plan[0].agent}
        assert t.oracle.expected_reward == max(leaf.reward for leaf in leaves)
    paths = [oracle_path(t) for t in train]
    with torch.no_grad():
        before = float(path_logprobs(policy.model, paths).mean())
    args = argparse.Namespace(warm_steps=6, warm_lr=1e-2, warm_tasks_per_step=8,
                              subtask="Solve it")
    after = fine_tune(policy.model, recipe, train, args, order_seed=0)
    assert after > before
    hits, misses = routed(policy.model, held, right)
    assert hits + len(misses) == len(held)


def test_training_tasks_can_be_shown_in_the_recipes_shuffled_pool_orders(
    tiny_policy_dir: Path, tmp_path: Path,
) -> None:
    """With `orders` 2, each training task has two trees whose prompts list the pool in the
    recipe's seeded orders (not all the file's), same plans and worth; held-out tasks keep the
    file's order."""
    import xgrammar as xgr

    from conductor_engine.engine.contracts.training import PolicyConfig, Recipe, RolloutConfig
    from conductor_engine.trainer.policy import load_policy
    from tests.benchmarks._plan_tree import leaves_under
    from tests.benchmarks.bench_routing_yardstick import pool_trees

    tok = load_policy(PolicyConfig(base=str(tiny_policy_dir), device="cpu")).tokenizer
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok),
                                              stop_token_ids=[tok.eos_token_id])
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    recipe = Recipe(rollouts=RolloutConfig(shuffle_pool=True))
    one, held, _ = pool_trees(27, recipe, tok, compiler, info, "Solve it", tmp_path)
    two, held2, _ = pool_trees(27, recipe, tok, compiler, info, "Solve it", tmp_path, orders=2)
    assert len(two) == 2 * len(one)
    assert [t.tokens for t in held] == [t.tokens for t in held2]
    by_task: dict[str, list[list[int]]] = {}
    for t in two:
        by_task.setdefault(t.task.id, []).append(t.tokens[: t.prompt_len])
        assert sorted(leaf.reward for leaf in leaves_under(t.root)) == sorted(
            leaf.reward for leaf in leaves_under(next(o.root for o in one
                                                      if o.task.id == t.task.id)))
    assert all(len(p) == 2 for p in by_task.values())
    file_order = {t.task.id: t.tokens[: t.prompt_len] for t in one}
    assert any(file_order[i] not in p for i, p in by_task.items())
