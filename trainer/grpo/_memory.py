"""Memory planning: whether a micro-batch's activations fit the device without checkpointing.

Under auto checkpointing (`Compute.auto_checkpointing`) each micro-batch is checkpointed only
when the bytes its passes keep per token, estimated (`_bytes_per_token`) until measured
(`_measure`), times its tokens, would not fit the free device memory beside the gradients and
AdamW state still to come (`_needs_checkpointing`). A micro-batch that runs out of memory anyway
doubles the judged bytes per token (`_after_oom`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from conductor_engine.trainer.grpo._compute import Compute, _hf
from conductor_engine.trainer.grpo._prefix import _shared_prefix_len
from conductor_engine.trainer.grpo._samples import Batch


def _pass_tokens(hf: Any, batch: Batch, *, prefix_run: bool = True) -> int:
    """Tokens a micro-batch's passes run: the shared prefix once (none when its group ran it,
    `prefix_run` False), the rest per row."""
    shared = _shared_prefix_len(hf, batch)
    b, width = batch.input_ids.shape
    return shared * prefix_run + b * (width - shared)


def _bytes_per_token(hf: Any, compute: int, stream: int, *, lora: bool = False,
                     dropout: bool = False) -> int:
    """What the forward keeps per token for the backward without checkpointing, estimated
    before anything was measured: per layer ~16 hidden-sized tensors (norms, q/k/v/o,
    residuals) of the residual stream's `stream` bytes (the weights' dtype; the norms upcast)
    and ~8 intermediate-sized ones (gate, up, activation, product) of the matmuls' `compute`
    bytes. A LoRA adapter on every linear layer keeps its own copy of each layer's input in
    the adapter's dtype, cast to `compute` by autocast: ~8 hidden-sized more; under dropout
    also the dropped float32 inputs (8 hidden-sized and 2 intermediate-sized more). For 7B
    (h 3584, i 18944, 28 layers) with LoRA on its bfloat16 base, 13.3 MB: 55 GB for a
    micro-batch of 8 paper rollouts at their longest (900 + 8 x 400 tokens), above the ~38 GiB
    issue 31 measured at its peak. On CPU it is above what autograd keeps and within 2x of it
    (tests/unit/trainer/test_grpo.py, with and without LoRA)."""
    cfg = hf.config.get_text_config() if hasattr(hf.config, "get_text_config") else hf.config
    h = cfg.hidden_size
    i = getattr(cfg, "intermediate_size", None) or 4 * h
    per_layer = 16 * h * stream + 8 * i * compute
    if lora:
        per_layer += 8 * h * compute + (8 * h * 4 + 2 * i * 4 if dropout else 0)
    return int(cfg.num_hidden_layers * per_layer)


# the backward's temporaries (about one layer's activations), the log-prob chunks, the
# allocator's fragmentation, cuBLAS workspaces
_HEADROOM = 4 * 2**30


def _needs_checkpointing(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                         batch: Batch, compute: Compute, *, prefix_run: bool = True) -> bool:
    """Whether this micro-batch's activations would not fit the free device memory (less
    4 GiB) beside the gradients and AdamW state not allocated yet. The bytes per token are
    the estimate above until a micro-batch has run without checkpointing, then the most
    measured (`_measure`). Off the GPU, never: no device memory to run out of, and the
    recomputation costs a third more compute."""
    device = batch.input_ids.device
    if device.type != "cuda":
        return False
    free = torch.cuda.mem_get_info(device)[0]
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    params = [p for g in optimizer.param_groups for p in g["params"]]

    def local(p: Tensor) -> int:
        return int(getattr(p, "_local_tensor", p).numel())

    pending = sum(4 * local(p) for p in params if p.grad is None)
    pending += sum(8 * local(p) for p in params if p not in optimizer.state)  # exp_avg(_sq)
    hf = _hf(model)
    tokens = _pass_tokens(hf, batch, prefix_run=prefix_run)
    return not fits(tokens * _per_token(hf, compute) + pending, free)


def _per_token(hf: Any, compute: Compute) -> int:
    """The bytes a pass keeps per token, as judged now: the most measured, else the estimate."""
    measured = compute.measured.get("bytes_per_token")
    if measured:
        return measured
    stream = next(hf.parameters()).element_size()
    elem = 2 if compute.autocast is not None else stream
    adapters = [m for m in hf.modules() if hasattr(m, "lora_A")]  # peft's LoRA layers
    dropout = any(getattr(d, "p", 0) > 0 for m in adapters
                  for d in getattr(m, "lora_dropout", {}).values())
    return _bytes_per_token(hf, elem, stream, lora=bool(adapters), dropout=dropout)


def _after_oom(model: torch.nn.Module, batch: Batch, compute: Compute) -> None:
    """A micro-batch ran out of device memory, judged to fit: judge later ones by twice the
    bytes per token (so a micro-batch half the size still runs without recomputing), and give
    the allocator's cached blocks back before the step runs again."""
    compute.measured["bytes_per_token"] = 2 * _per_token(_hf(model), compute)
    if batch.input_ids.device.type == "cuda":
        torch.cuda.empty_cache()


def fits(needed: int, free: int) -> bool:
    """Whether `needed` bytes fit in `free` device memory with 4 GiB to spare."""
    return needed <= free - _HEADROOM


@contextmanager
def _measure(model: torch.nn.Module, batch: Batch, compute: Compute, on: bool, *,
             prefix_run: bool = True) -> Iterator[None]:
    """With `on` (a micro-batch run without checkpointing under auto checkpointing): the bytes
    its passes keep for the backward, per token, kept as the most seen (`Compute.measured`).

    Counted as autograd saves them (each storage once; weights, which exist anyway, not at
    all), rather than from the allocator's peak, which a caller may be measuring itself."""
    if not on:
        yield
        return
    seen: set[int] = set()
    kept = [0]

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        if not isinstance(t, torch.nn.Parameter) and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            kept[0] += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield
    per_token = kept[0] // max(_pass_tokens(_hf(model), batch, prefix_run=prefix_run), 1)
    compute.measured["bytes_per_token"] = max(per_token,
                                              compute.measured.get("bytes_per_token", 0))
