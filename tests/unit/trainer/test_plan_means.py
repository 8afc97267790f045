"""Plan means as GRPO's reward (trainer/plan_means.py, `[rollouts] reward = "plan_mean"`): a
rollout is credited with the mean reward of its task's stored runs of the same plan, never
with another task's, and only where the reward is a function of the plan."""

from __future__ import annotations

import random

import pytest

from conductor_engine.engine.contracts.agent_calls import Message
from conductor_engine.engine.contracts.records import RoundRecord
from conductor_engine.engine.contracts.traces import Trace
from conductor_engine.engine.contracts.training import RolloutConfig
from conductor_engine.engine.rewards.rollouts import Group
from conductor_engine.trainer.plan_means import plan_means, poolable, with_plan_means
from conductor_engine.trainer.rollouts import group_stats
from tests.unit.trainer.test_warmup import REVIEW, SOLO, planned


def _group(task_id: str, rollouts: list[Trace]) -> Group:
    return Group(task_id=task_id, policy=rollouts[0].policy, traces=rollouts)


def test_a_rollout_is_credited_with_its_plan_s_mean_over_its_task_s_stored_runs() -> None:
    """Task a's group: the one-step plan right once (1.0) and wrong once (0.25), the review
    plan the same. By their own rewards the lucky one-step rollout ties the right review
    rollout. Its task's stored runs say the one-step plan is right 1 time in 8 and the review
    plan 7 in 8 (rehearsals included): credited with those means, both review rollouts beat
    both one-step ones. Task b's runs of the one-step plan (all right) never enter a's mean."""
    lucky, unlucky = planned("a", SOLO, 1.0), planned("a", SOLO, 0.25, minute=1)
    right, wrong = planned("a", REVIEW, 1.0, minute=2), planned("a", REVIEW, 0.25, minute=3)
    rollouts = [lucky, unlucky, right, wrong]
    stored = [*rollouts,
              *(planned("a", SOLO, 0.25, fixed_in="rehearse-me", minute=4 + i) for i in range(6)),
              *(planned("a", REVIEW, 1.0, fixed_in="rehearse-me", minute=4 + i)
                for i in range(6)),
              *(planned("b", SOLO, 1.0, minute=i) for i in range(10))]
    [(group, age)] = with_plan_means([(_group("a", rollouts), 0)], stored)
    assert age == 0 and group.rewards == [1.0, 0.25, 1.0, 0.25], "the runs' own rewards stay"
    solo, review = (1.0 + 7 * 0.25) / 8, (0.25 + 7 * 1.0) / 8
    assert group.credited == pytest.approx([solo, solo, review, review])
    assert [m.runs for m in group.plan_means or []] == [8, 8, 8, 8]
    assert min(group.credited[2:]) > max(group.credited[:2])
    assert group_stats([(group, 0)]).plan_runs == 8
    # a group without plan means credits each rollout its own draw
    assert _group("a", rollouts).credited == [1.0, 0.25, 1.0, 0.25]
    assert group_stats([(_group("a", rollouts), 0)]).plan_runs is None


def test_advantages_are_measured_on_the_credited_rewards() -> None:
    """The lucky one-step rollout of the test above is pushed down, not up, once credited
    with its plan's mean: the update's advantages follow `Group.credited`."""
    pytest.importorskip("transformers")
    from conductor_engine.trainer.grpo import group_advantages
    from conductor_engine.trainer.rollouts import update_samples
    from tests.grpo_inputs import tiny_tokenizer

    rollouts = [planned("a", SOLO, 1.0), planned("a", SOLO, 0.25, minute=1),
                planned("a", REVIEW, 1.0, minute=2), planned("a", REVIEW, 0.25, minute=3)]
    stored = [*rollouts, *(planned("a", REVIEW, 1.0, minute=4 + i) for i in range(4)),
              *(planned("a", SOLO, 0.25, minute=4 + i) for i in range(4))]
    for t in rollouts:
        t.rounds[0].attempts[0].prompt = [Message(role="user", content="w1 w2")]
    cfg = RolloutConfig(group_size=4, scale_rewards=False)
    own = update_samples([(_group("a", rollouts), 0)], tiny_tokenizer(), cfg)
    credited = with_plan_means([(_group("a", rollouts), 0)], stored)
    by_plan = update_samples(credited, tiny_tokenizer(), cfg)
    assert own[0].advantage > 0 and by_plan[0].advantage < 0, "the lucky draw, credited"
    assert [s.advantage for s in by_plan] == group_advantages(credited[0][0].credited,
                                                               scale=False)


def test_runs_of_two_rounds_with_a_self_call_or_failed_keep_their_own_reward() -> None:
    """Whose reward is not a draw of the plan alone counts towards no mean and is credited
    with its own: a second round was written after seeing the first one's answers, a
    self-call's answer is the policy's own, and an invalid plan has no plan to pool."""
    refined = planned("a", SOLO, 0.25)
    refined.rounds.append(RoundRecord(index=1, plan=refined.rounds[0].plan))
    self_call = planned("a", SOLO, 0.25, minute=1)
    self_call.rounds[0].steps[0].child_workflow_id = "conduct-a-child"
    invalid = planned("a", SOLO, 0.0, minute=2)
    invalid.status = "invalid_plan"
    plain = [planned("a", SOLO, 1.0, minute=3 + i) for i in range(3)]
    assert [poolable(t) for t in (refined, self_call, invalid, plain[0])] == [
        False, False, False, True]
    means = plan_means([refined, self_call, invalid, *plain])
    assert [(m.mean, m.runs) for m in means.values()] == [(1.0, 3)]
    [(group, _)] = with_plan_means([(_group("a", [refined, self_call, invalid, plain[0]]), 0)],
                                   [refined, self_call, invalid, *plain])
    assert group.credited == [0.25, 0.25, 0.0, 1.0]


def test_the_same_stored_runs_give_the_same_means_in_any_order() -> None:
    """Float sums depend on their order, and the store lists runs by finishing time: the means
    are summed in a fixed order, so an update does not change with the machine's load."""
    runs = [planned("a", SOLO, r, minute=i) for i, r in enumerate([0.1, 0.7, 0.2, 0.3, 0.6] * 5)]
    first = plan_means(runs)
    for seed in range(5):
        shuffled = runs[:]
        random.Random(seed).shuffle(shuffled)
        assert plan_means(shuffled) == first
