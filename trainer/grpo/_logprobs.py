"""Per-token log-probs of the policy being trained: logp_it of the loss (trainer/grpo/_loss.py).

The transformer runs over prompt + completion (its shared opening once: trainer/grpo/_prefix.py);
the LM head and the log-softmax run only where a completion token is in the loss, in chunks, in
float32, and at a choice over the tokens the plan grammar allowed there.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from conductor_engine.trainer.grpo._prefix import (
    GroupPrefix,
    _hidden_packed,
    _hidden_with_shared_prefix,
    _packable,
    _shared_prefix_len,
)
from conductor_engine.trainer.grpo._samples import Batch

# Logits are computed for this many elements (tokens x vocabulary) at a time: 64 Mi floats,
# 256 MiB in float32, whatever the batch. When there is more than one chunk, each is recomputed
# in the backward pass rather than kept, so the logits of the whole batch never exist at once.
_LOGIT_CHUNK = 2**26


def per_token_logprobs(model: torch.nn.Module, batch: Batch, *, temperature: float = 1.0,
                       prefix: GroupPrefix | None = None) -> Tensor:
    """log pi(token | prefix) of every completion token in the loss, [B, T] float32, 0 on
    padding and on forced tokens (see Sample.forced), whose log-probs are not computed.
    `prefix`: the shared prompt opening already run for the micro-batches of a group
    (`GroupPrefix`), read instead of run again.

    The transformer runs over prompt + completion, but the LM head and the log-softmax run only
    over the hidden states that predict real completion tokens (position t predicts token t+1),
    in chunks: log p = log_softmax(z)[token], z = lm_head(h) / temperature, in float32.

    `model` may be the policy wrapped for several ranks (`LogProbs` under DDP or FSDP): the
    call then goes through the wrapper, whose hooks synchronise the ranks.
    """
    if isinstance(model, LogProbs) or isinstance(getattr(model, "module", None), LogProbs):
        return model(batch, temperature=temperature)  # type: ignore[no-any-return]
    unwrap = getattr(model, "get_base_model", None)  # a peft model: LoRA layers sit inside
    hf: Any = unwrap() if unwrap is not None else model
    p = batch.prompt_len
    shared = _shared_prefix_len(hf, batch)
    if prefix is not None and prefix.length < shared and prefix.matches(batch, prefix.length):
        shared = prefix.length  # the update's opening, run once for its micro-batches
    if shared and batch.prefix == "packed" and _packable(hf):
        hidden = _hidden_packed(hf, batch, shared)  # [B, T, H], already shifted
    elif shared:
        hidden = _hidden_with_shared_prefix(hf, batch, shared, prefix)  # [B, T, H], shifted
    else:
        hidden = hf.base_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                               use_cache=False).last_hidden_state[:, p - 1 : -1]  # [B, T, H]
    mask = batch.loss_mask.bool()
    h = hidden[mask]  # [N, H] hidden states before each completion token
    targets = batch.input_ids[:, p:][mask]  # [N]
    choices = batch.choice_ids[mask]  # [N, K]
    head = hf.get_output_embeddings()
    step = max(1, _LOGIT_CHUNK // head.weight.shape[0])
    # the head runs in its weights' dtype, outside any autocast: float32 logits from float32
    # weights (TF32 matmuls on CUDA), as bfloat16 weights gave them before mixed precision
    h = h.to(head.weight.dtype)
    with torch.autocast(h.device.type, enabled=False):
        if h.shape[0] <= step:  # one chunk: recomputing it would save no memory
            logps = _token_logprobs(head, h, targets, choices, temperature)
        else:
            logps = torch.cat([
                checkpoint(_token_logprobs, head, h[i : i + step], targets[i : i + step],
                           choices[i : i + step], temperature, use_reentrant=False)
                for i in range(0, h.shape[0], step)
            ])
    out = torch.zeros(mask.shape, dtype=torch.float32, device=h.device)
    return out.masked_scatter(mask, logps)


class LogProbs(torch.nn.Module):
    """`per_token_logprobs` of `policy` as a module's forward, for DDP and FSDP2 to wrap.

    Both synchronise through the forward of the module they wrap (DDP prepares its gradient
    all-reduce there; FSDP2 gathers the root's parameters, the embeddings and the head, there),
    while the log-probs call the transformer and the head separately: this module is the one
    forward that covers both."""

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, batch: Batch, temperature: float = 1.0) -> Tensor:
        return per_token_logprobs(self.policy, batch, temperature=temperature)


def _token_logprobs(head: torch.nn.Module, h: Tensor, targets: Tensor, choices: Tensor,
                    temperature: float) -> Tensor:
    # z / T = head(h / T) for a head without bias: divide [n, H], not [n, V]
    z = head(h / temperature) if head.bias is None else head(h) / temperature
    z = z.float()
    logps = -torch.nn.functional.cross_entropy(z, targets, reduction="none")
    if choices.shape[-1] == 0:
        return logps
    # at a choice: log softmax over the allowed tokens only (pads, -1, contribute nothing)
    allowed = z.gather(1, choices.clamp(min=0)).masked_fill(choices < 0, float("-inf"))
    is_choice = choices[:, 0] >= 0
    among = z.gather(1, targets[:, None])[:, 0] - torch.logsumexp(allowed, dim=-1)
    return torch.where(is_choice, among, logps)
