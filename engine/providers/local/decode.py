"""One batch's `generate`: on the CPU with the prompt opening every row shares read once, on a
GPU with each group's prompt read once and a decode step that replays captured kernels.

CPU: `model.generate` with a dynamic cache. A batch's rows usually open alike (a conductor's
plans all start with its instructions, some 95 tokens of a 230-token prompt): the tokens every
row opens with (`shared_prefix`, at least `SHARED_PREFIX_MIN`) run once, as one row, and their
keys and values are repeated into every row of the cache (`DynamicCache.batch_repeat_interleave`);
`generate` then prefills the rest of each row and decodes. The rows are laid out as
`batching._run_batch` builds them: the shared opening, the row's padding, the rest of its prompt
(`generate` numbers positions from the attention mask, so padding inside a row is skipped as
padding on its left is). A batch of one row runs exactly as `generate` alone runs it.

GPU (`LoadedModel.on_gpu`), with transformers' own mechanisms:

- **one prefill per group.** The rollouts of a task share their prompt (a GRPO group: 64 rows,
  one prompt). The batch's distinct prompts run once, left-padded to the batch's width, into a
  small dynamic cache; each row of the batch then gets its prompt's keys and values copied into
  the batch's cache (`Cache.update`, the call an attention layer makes), so a group of 64 costs
  one prompt's prefill, not 64. Everything but the prompt's last token is prefilled this way;
  `generate` runs that token itself, as it does when it is handed a cache that holds a prompt.
- **a static KV cache** (transformers' `StaticCache`), one in the process, reset for the next
  batch of the same model and shape (rows, cache length rounded up to `CACHE_BUCKET`), so its
  tensors keep their addresses. Handed a compileable cache on CUDA, `generate` compiles its
  decode step by itself (`GenerationMixin._valid_auto_compile_criteria`, default `CompileConfig`:
  `torch.compile` in mode "reduce-overhead", i.e. CUDA graphs): a step is a graph replay, not
  hundreds of Python-launched kernels. The first batch of a shape pays the compile.

The logits processors (grammar mask, sampler, log-prob recorder) run between steps as before,
on the logits' device; the only host transfers a step needs are the sampled ids the grammar's
matchers read and the bitmask they fill (grammar.GrammarMask).
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from conductor_engine.engine.providers.local.model import LoadedModel

CACHE_BUCKET = 256
"""A static cache's length is the batch's prompt width plus its new tokens, rounded up to this,
so batches of nearby widths reuse one cache (and one compiled decode step)."""

static_on_cpu = False
"""Tests set this to run the GPU way on the CPU (where `generate` compiles nothing): the same
cache, prefill and expansion, checked against the CPU way's outputs."""

kept: tuple[tuple[str, int, int], Any] | None = None
"""The process's static cache and its (model name, rows, length), for the next batch that fits."""


SHARED_PREFIX_MIN = 16
"""The fewest tokens every row must open with for the CPU way to run them once: below that
the extra forward pass costs more than the rows it spares."""


def shared_prefix(prompts: list[list[int]]) -> int:
    """How many tokens the CPU way runs once for the batch of `prompts`: the tokens every
    prompt opens with, less at least each prompt's last token (`generate` runs that one, so it
    has logits to sample from); 0 for a single prompt or an opening under `SHARED_PREFIX_MIN`."""
    if len(prompts) < 2:
        return 0
    shared = min(len(os.path.commonprefix(prompts)), min(len(p) for p in prompts) - 1)
    return shared if shared >= SHARED_PREFIX_MIN else 0


def opening_run_once(loaded: LoadedModel, prompts: list[list[int]]) -> int:
    """How many opening tokens of this batch run once: `shared_prefix` the CPU way, 0 the GPU
    way, whose rows must be padded on the left only (its prefill groups rows by prompt, and
    the compiled decode step reads a left-padded batch)."""
    return 0 if (loaded.on_gpu or static_on_cpu) else shared_prefix(prompts)


def generate(loaded: LoadedModel, input_ids: Any, attention: Any, *, shared: int = 0,
             static: bool | None = None, **options: Any) -> Any:
    """The batch's ids (prompts and generated tokens), batch × (width + steps).

    `shared`: the first `shared` columns are the same tokens in every row, none of them
    padding (`shared_prefix`); the CPU way runs them once. `options` are `generate`'s
    (max_new_tokens, logits_processor, stopping_criteria, ...); `static` chooses the GPU way
    (default: on a GPU only, or where `static_on_cpu` is set)."""
    static = (loaded.on_gpu or static_on_cpu) if static is None else static
    if static:
        cache = {cache_argument(loaded.model): prefilled_cache(
            loaded, input_ids, attention, int(options["max_new_tokens"]))}
    elif shared:
        cache = {cache_argument(loaded.model): shared_prefix_cache(
            loaded, input_ids[:1, :shared], int(input_ids.shape[0]))}
    else:
        cache = {}
    out = loaded.model.generate(input_ids=input_ids, attention_mask=attention, **cache, **options)
    return getattr(out, "sequences", out)  # a saved generation config may ask for a dict


def cache_argument(model: Any) -> str:
    """The name the model's forward takes a cache by: `cache` in recent transformers,
    `past_key_values` before (and still accepted, deprecated, by `generate`)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters \
        else "past_key_values"


def shared_prefix_cache(loaded: LoadedModel, prefix: Any, batch: int) -> Any:
    """A dynamic cache holding `prefix` (1 × tokens, no padding) for each of `batch` rows,
    computed once: the keys and values of one row's forward, repeated."""
    import torch
    from transformers import DynamicCache

    cache: Any = DynamicCache()
    with torch.inference_mode():
        loaded.model(input_ids=prefix, attention_mask=torch.ones_like(prefix),
                     **{cache_argument(loaded.model): cache}, use_cache=True, logits_to_keep=1)
    cache.batch_repeat_interleave(batch)
    return cache


def prefilled_cache(loaded: LoadedModel, input_ids: Any, attention: Any,
                    max_new_tokens: int) -> Any:
    """A static cache for the batch holding every row's prompt but its last token, each
    distinct prompt computed once (see the module's docstring)."""
    import torch
    from transformers import DynamicCache

    model = loaded.model
    batch, width = (int(n) for n in input_ids.shape)
    rows = [tuple(r) for r in input_ids.tolist()]  # a prompt and its left padding: a group
    first: dict[tuple[int, ...], int] = {}
    group = torch.tensor([first.setdefault(r, len(first)) for r in rows],
                         device=input_ids.device)
    distinct = torch.tensor([rows.index(r) for r in first], device=input_ids.device)
    ids, mask = input_ids[distinct, : width - 1], attention[distinct, : width - 1]
    # positions as `generate` gives a left-padded row: counted from its first real token
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    prefix: Any = DynamicCache()  # its layers: keys and values, batch x heads x tokens x dim
    with torch.inference_mode():
        model(input_ids=ids, attention_mask=mask, position_ids=positions,
              **{cache_argument(model): prefix}, use_cache=True, logits_to_keep=1)
    cache = static_cache(loaded, batch, width + max_new_tokens)
    where = {"cache_position": torch.arange(width - 1, device=input_ids.device)}
    with torch.inference_mode():
        for i, layer in enumerate(prefix.layers):
            cache.update(layer.keys.index_select(0, group), layer.values.index_select(0, group),
                         i, where)
    del prefix
    return cache


def static_cache(loaded: LoadedModel, batch: int, tokens: int) -> Any:
    """A static cache for `batch` rows of at least `tokens` of the model, emptied: the process
    keeps one (one thread generates) and hands it out again when the next batch's shape fits,
    whichever version of the model asks (a cache holds no weights), so its tensors keep their
    addresses and the captured decode step replays; else a new one replaces it (the old one
    freed first)."""
    from transformers import StaticCache

    global kept
    length = -(-tokens // CACHE_BUCKET) * CACHE_BUCKET
    key = (loaded.name, batch, length)
    if kept is not None and kept[0] == key:
        kept[1].reset()
        return kept[1]
    kept = None
    cache = StaticCache(config=loaded.model.config, max_cache_len=length)
    kept = (key, cache)
    return cache
