"""The training workflow's pure helpers (the workflow itself runs in tests/integration)."""

from conductor_engine.workflows.train import (
    REHEARSAL_SAMPLES_FROM,
    WARMUP_SAMPLES_FROM,
    rollout_draw,
)


def test_each_iterations_rollouts_draw_under_sample_numbers_no_other_rollout_uses() -> None:
    # A task's rollout k drew under sample k in every iteration, so the sim's agents gave a plan
    # written greedily the same answers each iteration. Now every (iteration, k) has its own.
    numbers = [rollout_draw(i, k, 4) for i in range(50) for k in range(4)]
    assert len(set(numbers)) == len(numbers)
    assert [rollout_draw(0, k, 4) for k in range(4)] == [0, 1, 2, 3]
    assert [rollout_draw(2, k, 4) for k in range(4)] == [8, 9, 10, 11]


def test_rollout_draws_stay_below_the_rehearsals_and_warm_up_samples() -> None:
    # rehearsals and warm-up samples draw above; a rollout never shares their answers
    assert WARMUP_SAMPLES_FROM > REHEARSAL_SAMPLES_FROM
    for iteration, group in ((10**6, 64), (123_456, 16), (REHEARSAL_SAMPLES_FROM, 1)):
        assert 0 <= rollout_draw(iteration, group - 1, group) < REHEARSAL_SAMPLES_FROM
