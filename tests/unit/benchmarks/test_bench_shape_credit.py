"""The tabular credit benchmark's own arithmetic (tests/benchmarks/bench_shape_credit.py): the
shape-first plan form as a policy, the trainer's shape credit on it, and how each warm-up picks
a task's plan."""

from __future__ import annotations

import importlib.util
import random

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="the local extra is not installed (pip install -e '.[local]')",
)


def test_both_plan_forms_give_every_plan_a_probability_and_start_at_the_same_second_step() -> None:
    import torch

    from tests.benchmarks.bench_shape_credit import Policy, ShapeFirst, kinds

    names, ks = kinds(1)
    plans = list(ks[0].value)
    assert len(plans) == 4 + 2 * 4 * 4
    for form in (Policy, ShapeFirst):
        probs = form(len(names), 0.02).plan_probs(plans).detach()
        assert float(probs.sum()) == pytest.approx(1.0)
        two = sum(float(q) for q, p in zip(probs, plans, strict=True) if p[1] is not None)
        assert two == pytest.approx(0.02)
        sees = sum(float(q) for q, p in zip(probs, plans, strict=True) if p[1] is not None and p[2])
        assert sees == pytest.approx(0.01)
    assert torch.allclose(Policy(4, 0.02).plan_probs(plans), ShapeFirst(4, 0.02).plan_probs(plans))


def test_a_shape_first_plan_forced_to_its_shape_says_so_for_the_shape_token_alone() -> None:
    from tests.benchmarks.bench_shape_credit import ShapeFirst

    pol, rng = ShapeFirst(4, 0.02), random.Random(0)
    for _ in range(20):
        plan, forced = pol.draw(rng, 0.0, ("more", "apart", "end"))
        assert plan[1] is not None and not plan[2]
        assert forced == [True, False, False]


def test_shape_first_credit_gives_the_shape_its_means_gain_and_each_agent_its_shapes_baseline(
        ) -> None:
    """The shape token: b(s) - b(()); the agents after it: R - b(s); a forced rollout's shape
    token is not the policy's; and a forced rollout alone in its shape takes the group credit
    (its shape's mean would be its own reward, crediting it nothing)."""
    from conductor_engine.trainer.grpo._shapes import shape_advantages
    from tests.benchmarks.bench_shape_credit import ShapeFirst

    pol = ShapeFirst(4, 0.02)
    group = [((1, None, False), 1.0, False), ((2, None, False), 0.5, False),
             ((1, 3, True), 0.9, False), ((3, 1, True), 0.5, True), ((0, 0, False), 0.2, True)]
    shaped = [pol.shaped(plan, r, f, [])[0] for plan, r, f in group]
    got = shape_advantages(shaped, scale=False)
    task = (1.0 + 0.5 + 0.9 + 0.5 + 0.2) / 5
    one, sees = 0.75, 0.7
    assert got[0] == pytest.approx([one - task, 1.0 - one])
    assert got[1] == pytest.approx([one - task, 0.5 - one])
    assert got[2] == pytest.approx([sees - task, 0.9 - sees, 0.9 - sees])
    assert got[3][1:] == pytest.approx([0.5 - sees, 0.5 - sees])
    assert got[4] == pytest.approx([0.2 - task] * 3)


def test_the_shipped_warm_up_picks_the_best_right_run_and_the_rehearsed_one_the_best_mean(
        ) -> None:
    """Best of runs: the highest realised reward among right runs, then the cheaper; best of
    means: the highest mean over every run of a plan, then more runs, then the cheaper."""
    from tests.benchmarks.bench_shape_credit import best_mean, best_run

    lucky, sure, dear = (2, None, False), (1, 3, True), (0, None, False)
    cost = {lucky: 0.001, sure: 0.002, dear: 0.024}
    assert best_run([(sure, True, 0.99), (lucky, True, 0.995), (dear, True, 0.88)],
                    cost) == lucky
    assert best_run([(sure, False, 0.24), (lucky, False, 0.245)], cost) is None
    assert best_mean({lucky: [0.995, 0.245, 0.245], sure: [0.99, 0.99, 0.24]}, cost) == sure
    assert best_mean({lucky: [0.5, 0.5], sure: [0.5, 0.5, 0.5]}, cost) == sure
    assert best_mean({sure: [0.5], lucky: [0.5]}, cost) == lucky
