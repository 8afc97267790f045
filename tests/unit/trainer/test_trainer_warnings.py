"""`conductor train start` prints no deprecation warnings caused by the trainer's own calls.

transformers 5 renamed a decoder's `past_key_values` to `cache` and deprecated
`is_gradient_checkpointing` (which peft reads when it wraps a model in a LoRA); each printed a
FutureWarning on every update. The trainer's paths run here with those warnings as errors.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conductor_engine.engine.contracts.training import LossConfig, PolicyConfig  # noqa: E402
from conductor_engine.trainer.grpo import (  # noqa: E402
    collate,
    make_optimizer,
    per_token_logprobs,
    train_step,
)
from tests.grpo_inputs import PAD, random_samples, tiny_model, tiny_model_dir  # noqa: E402


def test_the_shared_prefix_pass_uses_the_current_cache_keyword() -> None:
    model = tiny_model()
    samples = random_samples(3, old=False, groups=1, completion_len=(6, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        per_token_logprobs(model, collate(samples, PAD))


def test_a_lora_policy_loads_and_trains_without_deprecation_warnings(tmp_path: Path) -> None:
    from conductor_engine.trainer.policy import load_policy, save_checkpoint

    cfg = PolicyConfig(base=str(tiny_model_dir(tmp_path)), lora_r=4, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        policy = load_policy(cfg)
        loss = LossConfig(learning_rate=1e-3)
        train_step(policy.model, make_optimizer(policy.model, loss), random_samples(4, old=False),
                   loss)
        save_checkpoint(policy, tmp_path / "adapter")
        load_policy(cfg, checkpoint_dir=tmp_path / "adapter")  # a LoRA continued from its adapter
