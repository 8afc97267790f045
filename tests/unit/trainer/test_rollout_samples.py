"""A plan attempt from a trace as the trainer's Sample (trainer/rollouts.attempt_sample): the
choices the grammar left travel with it, and a record that does not fit its tokens is never
scored in a space the sampler did not use."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from conductor_engine.engine.contracts.agent_calls import Message  # noqa: E402
from conductor_engine.engine.contracts.records import PlanAttempt  # noqa: E402
from conductor_engine.trainer.rollouts import attempt_sample  # noqa: E402
from tests.grpo_inputs import tiny_tokenizer  # noqa: E402


def attempt(**fields: object) -> PlanAttempt:
    return PlanAttempt.model_validate({
        "attempt": 1, "raw_text": "w3 w4 w5", "prompt": [Message(role="user", content="w1 w2")],
        "token_ids": [3, 4, 5], "logprobs": [-0.1, -0.7, -0.2], "forced_positions": [0],
        "finish_reason": "stop", **fields})


def test_the_choices_of_a_local_plan_travel_with_its_sample() -> None:
    # as a trace stores it: JSON object keys are strings, read back as token indices
    record = attempt(choice_tokens={"1": [4, 9, 10]})
    sample = attempt_sample(PlanAttempt.model_validate_json(record.model_dump_json()),
                            tiny_tokenizer(), 1.0)
    assert sample is not None
    assert sample.choices == {1: [4, 9, 10]}
    assert sample.behaviour_logprobs == [-0.1, -0.7, -0.2]
    assert sample.forced == [True, False, False]


@pytest.mark.parametrize("choices", [{1: [9, 10]}, {3: [4, 5]}], ids=["other-token", "past-end"])
def test_choices_that_do_not_fit_the_tokens_drop_the_behaviour_logprobs_too(
    choices: dict[int, list[int]]
) -> None:
    """Those log-probs were renormalised over sets the trainer cannot rebuild: scoring them
    over the whole vocabulary instead would make a wrong ratio, so the first step's own
    log-probs stand in (ratio 1), as for a conductor that records none."""
    sample = attempt_sample(attempt(choice_tokens=choices), tiny_tokenizer(), 1.0)
    assert sample is not None
    assert sample.choices is None and sample.behaviour_logprobs is None
