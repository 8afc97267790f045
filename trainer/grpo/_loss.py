"""The GRPO loss, the method itself: what is minimised, with its equations.

The objective is TRL's `GRPOTrainer` loss for `loss_type` in {grpo, dr_grpo, dapo}, with the same
names and meanings (tests/unit/trainer/test_grpo_trl.py checks loss and gradients against TRL
itself).
For one completion o_i of a group, sampled by the behaviour policy pi_old, with token log-probs

    logp_it = log pi(o_it | q, o_i<t)        (the policy being trained)
    old_it  = log pi_old(o_it | q, o_i<t)    (recorded when the rollout was sampled)

    r_it   = exp(logp_it - old_it)                                   importance ratio
    l_it   = -min(r_it * A_i, clip(r_it, 1 - eps_low, 1 + eps_high) * A_i)
           + beta * r_it * (exp(ref_it - logp_it) - (ref_it - logp_it) - 1)    k3 KL to pi_ref

and the per-token losses l_it (over the mask m_it: 1 on completion tokens, 0 on padding and on
tokens a plan grammar forced, see Sample.forced) are aggregated per `loss_type`:

    grpo     L = 1/B * sum_i ( sum_t m_it l_it / sum_t m_it )      mean per sequence, then mean
    dr_grpo  L = sum_it m_it l_it / (B * max_completion_length)    a constant normaliser
    dapo     L = sum_it m_it l_it / sum_it m_it                    tokens of the whole batch

A_i may be per token, A_it (credit per plan shape, trainer/grpo/_shapes.py:
Sample.token_advantages); everything else is unchanged.

B and the token count are those of the whole update (all micro-batches), so accumulating the
micro-batches' gradients gives exactly the full-batch gradient for every loss type.

`dapo` is the default (TRL's current default, from the DAPO paper): every token weighs the same,
so a long completion is not down-weighted per token as under `grpo` (the length bias Dr. GRPO and
DAPO point out), and the normaliser adapts to the batch, unlike dr_grpo's constant.

At a choice, where the plan grammar allowed only a few tokens C_it (which agent, which access:
Sample.choices), the sampling policy was the model renormalised over them, and so is pi here:

    logp_it = z_it[o_it] - log sum_{c in C_it} exp z_it[c]      z = logits / temperature

Over the whole vocabulary the right agent's token may carry e^-15, and a step that barely moves
the choice can multiply that by e^5: the clipped ratio would then measure a distance the
decision never travelled.

Where the trace has no behaviour log-probs (an API conductor), old = logp.detach(): the ratio is 1
and its gradient is the plain policy gradient A * grad logp. The KL term is weighted by r_it as
TRL does by default (`use_bias_correction_kl=True`, DeepSeek-V3.2): the unbiased gradient of the
reverse KL, which differs from the unweighted k3 gradient even where r_it = 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from conductor_engine.engine.contracts.training import LossConfig
from conductor_engine.trainer.grpo._samples import Batch, Sample


def loss_normaliser(samples: Sequence[Sample], cfg: LossConfig) -> float:
    """The denominator of the loss over a whole update (see the module docstring)."""
    tokens = sum(s.trained_tokens for s in samples if not (cfg.mask_truncated and s.truncated))
    return _normaliser(len(samples), tokens, cfg)


def _normaliser(n_samples: int, n_tokens: int | float, cfg: LossConfig) -> float:
    if cfg.loss_type == "grpo":
        return float(max(n_samples, 1))
    if cfg.loss_type == "dr_grpo":
        return float(max(n_samples, 1) * cfg.max_completion_length)
    return float(max(n_tokens, 1))


def grpo_loss(
    logprobs: Tensor,
    batch: Batch,
    cfg: LossConfig,
    *,
    ref_logprobs: Tensor | None = None,
    normaliser: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The clipped GRPO surrogate of one (micro-)batch, divided by `normaliser`.

    `normaliser` is `loss_normaliser(all samples of the update, cfg)` when this batch is one of
    several micro-batches; None normalises over this batch alone. `ref_logprobs` (the frozen
    reference's log-probs) is needed when cfg.beta > 0.

    Metrics (means over the tokens in the loss; "tokens" is their count): clip_low / clip_high,
    the fraction of tokens whose ratio sits beyond the lower bound with A < 0 / the upper bound
    with A > 0 (the clipped side of min(), where the token gets no gradient), clip_fraction their
    sum; ratio, the mean r; kl, the k3 estimate of KL(pi || pi_ref) when beta > 0, else of
    KL(pi_old || pi), how far the policy is from the one that sampled (0 where no behaviour
    log-probs were recorded).
    """
    mask = batch.loss_mask.to(logprobs.dtype)
    if cfg.mask_truncated:
        mask = mask * (~batch.truncated)[:, None]
    adv = batch.advantages[:, None] if batch.token_advantages is None else batch.token_advantages
    old = torch.where(batch.has_old[:, None], batch.old_logprobs, logprobs.detach())

    ratio = torch.exp(logprobs - old)  # r = pi / pi_old
    clipped = ratio.clamp(1 - cfg.epsilon_low, 1 + cfg.epsilon_high)
    per_token = -torch.min(ratio * adv, clipped * adv)
    if cfg.beta > 0:
        if ref_logprobs is None:
            raise ValueError("beta > 0 needs the reference model's log-probs")
        d = ref_logprobs - logprobs
        kl = torch.exp(d) - d - 1  # k3 estimate of KL(pi || pi_ref), >= 0
        per_token = per_token + cfg.beta * ratio * kl
    else:
        kl = ratio - 1 - (logprobs - old)  # k3 estimate of KL(pi_old || pi)

    if cfg.loss_type == "grpo":
        total = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum()
    else:
        total = (per_token * mask).sum()
    n_tokens = mask.sum()
    if normaliser is None:
        normaliser = _normaliser(logprobs.shape[0], n_tokens.item(), cfg)
    loss = total / normaliser

    with torch.no_grad():

        def mean(x: Tensor) -> float:
            return ((x * mask).sum() / n_tokens.clamp(min=1)).item()

        low = ((ratio < 1 - cfg.epsilon_low) & (adv < 0)).to(mask.dtype)
        high = ((ratio > 1 + cfg.epsilon_high) & (adv > 0)).to(mask.dtype)
        metrics = {
            "loss": loss.item(), "clip_low": mean(low), "clip_high": mean(high),
            "clip_fraction": mean(low + high), "ratio": mean(ratio), "kl": mean(kl),
            "tokens": n_tokens.item(),
        }
    return loss, metrics
