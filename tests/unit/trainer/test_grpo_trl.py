"""Agreement with TRL: on the same tiny model and the same batch, trainer/grpo/ and TRL's
GRPOTrainer give the same log-probs, the same loss and the same gradient on every parameter,
for loss_type grpo, dr_grpo and dapo, on-policy and with behaviour log-probs (ratios away from 1,
some clipped), asymmetric clipping, masked truncation and a KL term to a reference model.

TRL's side is its own loss (`GRPOTrainer.compute_loss`) on the inputs its
`_generate_and_score_completions` would hand it: prompt_ids (padded left), prompt_mask,
completion_ids (padded right), completion_mask (zero on a truncated completion under
`mask_truncated_completions`), advantages, num_items_in_batch and, when present,
old_per_token_logps and ref_per_token_logps. TRL is a test-only dependency.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl", reason="TRL is not installed (pip install trl): nothing to "
                                        "agree with")
pytest.importorskip("datasets", reason="TRL's GRPOTrainer needs the datasets package")

from conductor_engine.engine.contracts.training import LossConfig  # noqa: E402
from conductor_engine.trainer.grpo import Sample, collate, grpo_loss, per_token_logprobs  # noqa: E402
from tests.grpo_inputs import (  # noqa: E402
    PAD,
    random_samples,
    tiny_model,
    tiny_model_dir,
    tiny_tokenizer,
)
from tests.trl_inputs import trl_inputs  # noqa: E402

SAMPLES = 6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"))


def no_reward(completions: list[Any], **_: Any) -> list[float | None]:
    return [0.0] * len(completions)  # never called: the batch comes ready-made


def trl_trainer(model_dir: Path, cfg: LossConfig, out: Path) -> Any:
    """TRL's GRPOTrainer over the model saved in `model_dir`, configured as `cfg`."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(out), report_to=[], use_cpu=True, bf16=False, activation_checkpointing=False,
        per_device_train_batch_size=SAMPLES, num_generations=SAMPLES,
        loss_type=cfg.loss_type, epsilon=cfg.epsilon_low, epsilon_high=cfg.epsilon_high,
        beta=cfg.beta, mask_truncated_completions=cfg.mask_truncated,
        max_completion_length=cfg.max_completion_length, temperature=cfg.temperature,
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model, reward_funcs=no_reward, args=args,
        train_dataset=Dataset.from_dict({"prompt": ["w1 w2"] * SAMPLES}),
        processing_class=tiny_tokenizer(),
    )
    model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop, which we skip
    return trainer


def near_policy_samples(model: Any, *, old: bool, truncated: int, seed: int, groups: int = 0
                        ) -> list[Sample]:
    """Samples whose behaviour log-probs are the model's own plus noise: ratios spread around 1,
    a good share of them beyond the clip range."""
    samples = random_samples(SAMPLES, seed=seed, old=False, truncated=truncated, groups=groups)
    if old:
        with torch.no_grad():
            logp = per_token_logprobs(model, collate(samples, PAD))
        gen = torch.Generator().manual_seed(seed)
        for i, s in enumerate(samples):
            noise = 0.4 * torch.randn(len(s.completion_ids), generator=gen)
            s.behaviour_logprobs = (logp[i, : len(s.completion_ids)] + noise).tolist()
    return samples


CASES = [
    pytest.param(dict(old=False, beta=0.0, mask_truncated=False), id="on-policy"),
    pytest.param(dict(old=True, beta=0.0, mask_truncated=False), id="behaviour-logprobs"),
    pytest.param(dict(old=True, beta=0.0, mask_truncated=True), id="masked-truncation"),
    pytest.param(dict(old=False, beta=0.1, mask_truncated=False), id="kl-on-policy"),
    pytest.param(dict(old=True, beta=0.1, mask_truncated=True), id="kl-behaviour-logprobs"),
    # one GRPO group: its prompt runs once, and its completions read it as a KV cache
    pytest.param(dict(old=True, beta=0.1, mask_truncated=True, groups=1), id="one-group"),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_loss_and_gradients_agree_with_trl(loss_type: str, case: dict[str, Any],
                                           model_dir: Path, tmp_path: Path) -> None:
    cfg = LossConfig.model_validate(dict(
        loss_type=loss_type, epsilon_low=0.2, epsilon_high=0.28, beta=case["beta"],
        mask_truncated=case["mask_truncated"], max_completion_length=12, temperature=0.9))
    trainer = trl_trainer(model_dir, cfg, tmp_path)
    ours = tiny_model()
    samples = near_policy_samples(ours, old=case["old"], truncated=2, seed=len(loss_type),
                                  groups=case.get("groups", 0))
    batch = collate(samples, PAD)
    ref_logprobs = None
    if cfg.beta > 0:  # a reference some way from the policy, so the KL term is not zero
        with torch.no_grad():
            ref_logprobs = per_token_logprobs(tiny_model(seed=5), batch, temperature=0.9)

    loss, metrics = grpo_loss(per_token_logprobs(ours, batch, temperature=0.9), batch, cfg,
                              ref_logprobs=ref_logprobs)
    loss.backward()
    inputs = trl_inputs(samples, cfg, pad_id=PAD, ref_logprobs=ref_logprobs)
    theirs = trainer.compute_loss(trainer.model, inputs)
    theirs.backward()

    torch.testing.assert_close(loss, theirs, rtol=1e-5, atol=1e-7)
    trl_grads = dict(trainer.model.named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, trl_grads[name].grad, rtol=1e-4, atol=1e-6,
                                   msg=lambda m, name=name: f"{name}: {m}")
    if case["old"]:
        logged = trainer._metrics["train"]
        assert metrics["clip_fraction"] > 0
        assert metrics["clip_fraction"] == pytest.approx(logged["clip_ratio/region_mean"][-1])
        assert metrics["clip_low"] == pytest.approx(logged["clip_ratio/low_mean"][-1])
        assert metrics["clip_high"] == pytest.approx(logged["clip_ratio/high_mean"][-1])


def test_per_token_logprobs_agree_with_trl(model_dir: Path, tmp_path: Path) -> None:
    trainer = trl_trainer(model_dir, LossConfig(temperature=0.7), tmp_path)
    samples = random_samples(SAMPLES)
    batch = collate(samples, PAD)
    ours = per_token_logprobs(tiny_model(), batch, temperature=0.7)
    theirs, _, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, batch.input_ids, batch.attention_mask, batch.completion_mask.shape[1])
    torch.testing.assert_close(ours, theirs * batch.completion_mask, rtol=1e-5, atol=1e-5)
