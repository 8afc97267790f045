"""How a policy's passes run: mixed precision (autocast) and gradient checkpointing.

load_policy attaches a `Compute` to the model (`set_compute`); train_step reads it
(`compute_of`). The helpers here find the transformers model inside its wrappers (`_hf`) and its
decoder layers, and switch their checkpointing for the passes inside a context.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class Compute:
    """How train_step runs a policy's passes: load_policy sets it from the PolicyConfig
    (`set_compute`), train_step reads it (`compute_of`); a model without one runs as it is.

    autocast: the dtype the transformer's matmuls run in (torch.autocast), None for the
    weights' own. Weights, gradients and AdamW state stay in the weights' dtype, float32 for a
    full policy and for a LoRA adapter: at lr 1e-6 Adam's first step moves a weight by about
    1e-6, and bfloat16's spacing at a weight of 0.02 is 2^-13 (1.2e-4), so bfloat16 weights
    would round the move away, while float32's there is 2^-29 (1.9e-9)
    (tests/unit/trainer/test_grpo.py shows both). The LM head and the log-softmax stay out of
    autocast
    (per_token_logprobs).

    auto_checkpointing: decide gradient checkpointing per micro-batch, on only when its
    activations would not fit the device's free memory (`_needs_checkpointing`), and rerun a
    step checkpointed where a micro-batch ran out of memory anyway (`_optimiser_step`);
    load_policy has installed checkpointing, off. False: the model's own setting, as loaded.
    """

    autocast: torch.dtype | None = None
    auto_checkpointing: bool = False
    # what auto checkpointing has measured of this model's passes (`_measure`)
    measured: dict[str, int] = field(default_factory=dict, compare=False, repr=False)


def set_compute(model: torch.nn.Module, compute: Compute) -> None:
    """Attach how train_step should run `model`'s passes (see Compute)."""
    model.__dict__["conductor_compute"] = compute


def compute_of(model: torch.nn.Module) -> Compute:
    """What `set_compute` attached to `model` (or the model a DDP/LogProbs wrapper holds)."""
    for _ in range(5):  # DDP -> LogProbs -> peft -> transformers
        found = model.__dict__.get("conductor_compute")
        if found is not None:
            return found  # type: ignore[no-any-return]
        inner = getattr(model, "module", None) or getattr(model, "policy", None)
        if not isinstance(inner, torch.nn.Module):
            break
        model = inner
    return Compute()


def _hf(model: torch.nn.Module) -> Any:
    """The transformers model inside DDP, LogProbs and peft wrappers."""
    inner: Any = model
    while isinstance(getattr(inner, "module", None) or getattr(inner, "policy", None),
                     torch.nn.Module):
        inner = getattr(inner, "module", None) or inner.policy
    model = inner
    unwrap = getattr(model, "get_base_model", None)
    return unwrap() if unwrap is not None else model


def decoder_layers(model: Any) -> list[Any]:
    """The modules transformers checkpoints (the decoder layers), if any."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:  # transformers < 4.52: every module with the flag
        return [m for m in model.modules() if hasattr(m, "gradient_checkpointing")]
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def _checkpointing(model: Any) -> bool:
    """Whether gradient (activation) checkpointing is on in any decoder layer."""
    return any(getattr(m, "gradient_checkpointing", False) for m in decoder_layers(model))


@contextmanager
def _checkpointed(model: Any, on: bool) -> Iterator[None]:
    """Every decoder layer checkpointed (`on`) or not, for the passes inside; restored after.
    Turning it on needs the checkpoint function load_policy installed (`Compute`)."""
    layers = [m for m in decoder_layers(model) if hasattr(m, "_gradient_checkpointing_func")]
    before = [m.gradient_checkpointing for m in layers]
    try:
        for m in layers:
            m.gradient_checkpointing = on
        yield
    finally:
        for m, was in zip(layers, before, strict=True):
            m.gradient_checkpointing = was


def _autocast(device: torch.device, compute: Compute) -> Any:
    if compute.autocast is None:
        return nullcontext()
    return torch.autocast(device.type, dtype=compute.autocast)
