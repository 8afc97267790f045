"""The tabular credit benchmark's own arithmetic (tests/benchmarks/bench_shape_credit.py): the
shape-first plan form as a policy, the trainer's shape credit on it, and how each warm-up picks
a task's plan."""

from __future__ import annotations

import importlib.util
import random
from typing import Any

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


def test_a_rehearsal_round_pools_every_run_of_a_plan_and_rehearses_only_plans_new_to_the_task(
        ) -> None:
    from tests.benchmarks.bench_shape_credit import rehearse

    a, b = (0, None, False), (1, 2, True)
    rewards: dict = {}
    assert rehearse(rewards, [(a, True, 1.0), (a, False, 0.2)], 2, lambda q: 0.5) == 2
    assert rewards == {a: [1.0, 0.2, 0.5, 0.5]}
    assert rehearse(rewards, [(b, True, 0.9), (a, True, 1.0)], 2, lambda q: 0.7) == 2
    assert rewards == {a: [1.0, 0.2, 0.5, 0.5, 1.0], b: [0.9, 0.7, 0.7]}


def test_ties_to_the_cheaper_take_the_cheapest_plan_within_one_standard_error_of_the_best(
        ) -> None:
    """The best mean's standard error decides what is a tie; outside it the best mean stands."""
    from tests.benchmarks.bench_shape_credit import best_mean, cheapest_within_error

    one, twice = (0, None, False), (0, 0, True)
    cost = {one: 0.001, twice: 0.002}
    near = {twice: [1.0, 0.25, 1.0, 1.0], one: [1.0, 0.25, 1.0, 0.25]}  # 0.8125 and 0.625
    assert best_mean(near, cost) == twice
    assert cheapest_within_error(near, cost) == one  # 0.625 >= 0.8125 - 0.1875
    far = {twice: [1.0, 1.0, 1.0, 0.99], one: [0.25, 0.25, 0.25, 0.3]}
    assert cheapest_within_error(far, cost) == twice


def test_a_forced_warm_up_draws_its_share_of_each_two_step_shape_and_the_rest_free() -> None:
    """Of 8 samples at a share of 0.25, the first two see, the next two are apart: whatever the
    policy, whose second step starts at 0.02."""
    import argparse

    from tests.benchmarks.bench_shape_credit import Policy, kinds, warm_up

    names, ks = kinds(1)
    args = argparse.Namespace(warmup_tasks=1, warmup_samples=8, warmup_explore=0.0,
                              warmup_force=0.25, warmup_steps=0, warmup_tie="mean", lr=0.1,
                              warmup_rehearse_plans=0, warmup_rehearse_by_tie=False)
    seen: list = []

    class Recording(Policy):
        def draw(self, rng: random.Random, explore: float, force: Any) -> Any:
            out = super().draw(rng, explore, force)
            seen.append((force, out[0]))
            return out

    policies = [Recording(len(names), 0.02) for _ in ks]
    _, runs, _ = warm_up(policies, ks, args, random.Random(0), 0, forced=True)
    assert runs == 8
    for k in range(len(ks)):
        mine = seen[8 * k: 8 * k + 8]
        assert [f for f, _ in mine] == [("more", "sees", "end")] * 2 + [
            ("more", "apart", "end")] * 2 + [None] * 4
        assert all(p[1] is not None and p[2] for _, p in mine[:2])
        assert all(p[1] is not None and not p[2] for _, p in mine[2:4])


def test_a_rollout_credited_by_plan_mean_takes_its_plan_s_mean_over_the_task_s_runs() -> None:
    """The group's draws join the task's runs (a warm-up's included) before the means."""
    from tests.benchmarks.bench_shape_credit import plan_means

    solo, review = (0, None, False), (1, 2, True)
    runs: dict = {solo: [0.25, 0.25, 0.25], review: [1.0]}
    credited = plan_means(runs, [solo, review, solo], [1.0, 0.0, 0.25])
    assert credited == [0.4, 0.5, 0.4]
    assert runs == {solo: [0.25, 0.25, 0.25, 1.0, 0.25], review: [1.0, 0.0]}


def test_a_borrowed_warm_up_runs_on_each_task_the_plans_its_siblings_selected_last_round(
) -> None:
    """Round 2 of a borrowed warm-up runs, on each task, what the kind's other task selected
    in round 1 (the same draws as a one-round warm-up up to then); without borrowing, not."""
    import argparse

    from tests.benchmarks.bench_shape_credit import Policy, kinds, tie_rule, warm_up

    names, ks = kinds(1)
    args = argparse.Namespace(warmup_tasks=2, warmup_samples=2, warmup_explore=0.5,
                              warmup_force=0.0, warmup_steps=0, warmup_tie="mean", lr=0.1,
                              warmup_rehearse_plans=0, warmup_rehearse_by_tie=False)

    def tasks(rounds: int, borrowed: bool) -> list[Any]:
        policies = [Policy(len(names), 0.5) for _ in ks]
        return warm_up(policies, ks, args, random.Random(3), 0, rounds=rounds,
                       borrowed=borrowed)[2]

    first = tasks(1, False)
    picked = [[tie_rule("mean")(t.rewards, k.cost) for t in kind]
              for k, kind in zip(ks, first, strict=True)]
    lent = tasks(2, True)
    kept = tasks(2, False)
    for i in range(len(ks)):
        for j in (0, 1):
            assert picked[i][1 - j] in lent[i][j].rewards
    assert any(picked[i][1 - j] not in kept[i][j].rewards
               for i in range(len(ks)) for j in (0, 1))
