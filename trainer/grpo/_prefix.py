"""The shared prompt opening, run once: the log-probs' main saving.

Rows of a micro-batch open with the same prompt tokens (a group's whole prompt; across tasks,
the conductor's instructions). That opening runs once with batch 1 and the rows read it as a KV
cache (`_hidden_with_shared_prefix`), or, under FSDP2, packed with the rows into one sequence
(`_hidden_packed`). Across micro-batches, a run of them that open alike runs the opening once
per optimiser step (`GroupPrefix`, `_group_runs`). Loss and gradients are those of full passes
(tests/unit/trainer/test_grpo.py checks).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache, partial
from typing import Any, cast

import torch
from torch import Tensor

from conductor_engine.trainer.grpo._compute import _checkpointed, _checkpointing, decoder_layers
from conductor_engine.trainer.grpo._samples import Batch

# The prompt opening the micro-batches of an update share (the conductor's instructions) runs
# once per optimiser step for all of them where their own openings differ beyond it
# (`_group_runs`, `GroupPrefix`); False: only runs of micro-batches with one opening share it
# (tests/benchmarks/bench_iteration.py --baseline turns it off).
SHARE_UPDATE_PREFIX = True


def _prompt_starts(batch: Batch) -> Tensor:
    """Column where each row's prompt begins (prompts are padded on the left), [B]."""
    return batch.prompt_len - batch.attention_mask[:, : batch.prompt_len].sum(1)


def _shared_prefix_len(hf: Any, batch: Batch) -> int:
    """How many tokens every row's prompt starts with, to run once for all rows (0 for one row).

    A GRPO group's G rows share their whole prompt; rows of different tasks, or runs offered
    the pool in different orders, still share the conductor's instructions. The prefix stops
    one token short of the shortest prompt, so every row's last prompt token, whose hidden
    state predicts its first completion token, is in the part run per row."""
    b, p = batch.input_ids.shape[0], batch.prompt_len
    if b < 2 or batch.prefix == "none":
        return 0
    starts = _prompt_starts(batch)
    room = p - int(starts.max()) - 1  # the shortest prompt, less its last token
    if room < 1:
        return 0
    cols = starts[:, None] + torch.arange(room, device=starts.device)  # [B, room]
    aligned = batch.input_ids.gather(1, cols)  # each prompt's first `room` tokens
    differs = (aligned != aligned[:1]).any(0).nonzero()
    return int(differs[0]) if len(differs) else room


def _hidden_with_shared_prefix(hf: Any, batch: Batch, shared: int,
                               prefix: GroupPrefix | None = None) -> Tensor:
    """The hidden states before each completion token, [B, T, H], running the `shared` prefix
    tokens every prompt starts with once.

    The prompt is most of the tokens (the conductor's instructions and pool, then a plan of a
    few dozen tokens), and its opening is the same on every row, so it runs once with batch 1
    and its keys and values are repeated for the B rows, which attend to them as a KV cache.
    Each row's rest (its own prompt tail and completion) runs with its left padding moved
    after the cache: masked, and with explicit positions so every token keeps the position it
    has in a full pass. Gradients flow back through the repeated cache into the one prefix
    pass, so loss and gradients are those of B full passes (tests/unit/trainer/test_grpo.py
    checks) at
    a fraction of the compute.

    Under gradient checkpointing, transformers drops a cache a layer would write (its backward
    recompute would append the keys twice). So the prefix, one row, runs without checkpointing
    (its activations are 1/B of the rows'), and the rows read the prefix through a cache that
    is never written (`_ReadOnlyPrefix`): recomputing a layer reads the same keys again, which
    is what lets a layer keep its cache under checkpointing (`_can_checkpoint_with_cache`).
    """
    p, b = batch.prompt_len, batch.input_ids.shape[0]
    if prefix is not None and prefix.matches(batch, shared):
        cache = prefix.cache(hf)  # run once for the group's micro-batches
    else:
        cache = _run_prefix(hf, _prefix_ids(batch, shared))
    given = {_cache_keyword(hf.base_model): cache}
    rest_ids, rest_mask, positions = _rows_after_prefix(batch, shared)
    kept = _read_only(cache, b) and all(hasattr(m, "_can_checkpoint_with_cache")
                                        for m in decoder_layers(hf))
    with _checkpointed(hf, _checkpointing(hf) and kept), _cache_kept(hf, kept):
        rest = hf.base_model(input_ids=rest_ids, position_ids=positions,
                             attention_mask=torch.cat([rest_mask.new_ones(b, shared), rest_mask],
                                                      1),
                             use_cache=True, **given).last_hidden_state
    return rest[:, p - 1 - shared :]  # column j of the batch is column j - shared here


def _run_prefix(hf: Any, ids: Tensor) -> Any:
    """The prompt opening `ids` [1, shared] run once, not checkpointed: its filled KV cache.
    (The layers fill the cache they are given; the model's output may not return it: with
    checkpointing installed, transformers' Qwen2 forces use_cache off and returns None.)"""
    from transformers import DynamicCache

    cache = DynamicCache(config=hf.config)
    with _checkpointed(hf, False):
        hf.base_model(input_ids=ids, use_cache=True, **{_cache_keyword(hf.base_model): cache})
    return cache


@dataclass
class GroupPrefix:
    """The prompt opening a run of micro-batches shares (a group's whole prompt), run once for
    all of them rather than once per micro-batch.

    The paper's group is 64 rollouts of one ~900-token prompt: at 8 rows a micro-batch, the
    prompt would otherwise run forward and backward 8 times. Here it runs once without
    gradients, and its keys and values, one leaf tensor per layer, are the cache every
    micro-batch's rows read. Each micro-batch's backward leaves dL/d(keys, values) on the
    leaves, summed in float32 (`grads`). After the run's last micro-batch the prefix runs once
    more, with gradients, and one backward takes the summed gradients through it (`backward`):
    as L is a sum over micro-batches, the chain rule gives the gradient of a backward through
    each micro-batch's own prefix pass, at two forward passes and one backward of the prefix
    instead of 8 of each."""

    ids: Tensor  # [1, shared]
    leaves: list[tuple[Tensor, Tensor]]  # per layer: keys, values [1, kv heads, shared, d]
    grads: list[Tensor | None] = field(default_factory=list)  # float32 sums, as `leaves` flat

    @classmethod
    def run(cls, hf: Any, ids: Tensor) -> GroupPrefix:
        with torch.no_grad():
            layers = _run_prefix(hf, ids).layers
        out = cls(ids, [(layer.keys.requires_grad_(), layer.values.requires_grad_())
                        for layer in layers])
        out.grads = [None] * (2 * len(layers))
        for j, leaf in enumerate(t for kv in out.leaves for t in kv):
            leaf.register_post_accumulate_grad_hook(partial(out._take, j))
        return out

    def _take(self, j: int, leaf: Tensor) -> None:
        g = cast(Tensor, leaf.grad)
        g = g.to(torch.promote_types(g.dtype, torch.float32))  # bfloat16 sums in float32
        self.grads[j] = g if self.grads[j] is None else cast(Tensor, self.grads[j]).add_(g)
        leaf.grad = None

    @property
    def length(self) -> int:
        return int(self.ids.shape[1])

    def matches(self, batch: Batch, shared: int) -> bool:
        return shared == self.ids.shape[1] and bool(
            (_prefix_ids(batch, shared) == self.ids).all())

    def cache(self, hf: Any) -> Any:
        """A cache holding the leaves (the rows' gradients reach them through it)."""
        from transformers import DynamicCache

        cache = DynamicCache(config=hf.config)
        for i, (keys, values) in enumerate(self.leaves):
            cache.update(keys, values, i)
        return cache

    def backward(self, hf: Any) -> None:
        """The prefix again, with gradients, and the summed gradients of its keys and values
        taken through it into the weights."""
        layers = _run_prefix(hf, self.ids).layers
        outs = [t for layer in layers for t in (layer.keys, layer.values)]
        pairs = [(o, g.to(o.dtype)) for o, g in zip(outs, self.grads, strict=True)
                 if g is not None]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])


def _group_runs(hf: Any, batches: Sequence[tuple[Batch, float]]) -> dict[int, tuple[int, int]]:
    """Runs of two or more consecutive micro-batches whose prompts open alike, to run that
    opening once for all of them: the first index of each run -> (its last, the opening's
    length in tokens).

    First the micro-batches that open with the same shared prefix (train_step puts a group's
    rows together, so a group's whole prompt); then, with SHARE_UPDATE_PREFIX, each stretch of
    the others runs the opening all of them share (the conductor's instructions), where that
    saves more than it costs: a micro-batch whose rows share much more than that (a group's
    whole prompt) keeps running its own opening once."""
    keys: list[tuple[int, ...] | None] = []
    for batch, _ in batches:
        shared = _shared_prefix_len(hf, batch) if batch.prefix == "cache" else 0
        keys.append(tuple(_prefix_ids(batch, shared)[0].tolist()) if shared else None)
    runs: dict[int, tuple[int, int]] = {}
    start = 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or keys[i] != keys[start]:
            if keys[start] is not None and i - start > 1:
                runs[start] = (i - 1, len(cast(tuple[int, ...], keys[start])))
            start = i
    if not SHARE_UPDATE_PREFIX:
        return runs
    inside = {j for first, (last, _) in runs.items() for j in range(first, last + 1)}
    rest = [j for j, key in enumerate(keys) if j not in inside and key is not None]
    if len(rest) < 2:
        return runs
    common = _common_length([cast(tuple[int, ...], keys[j]) for j in rest])
    # a micro-batch gains when the opening it no longer runs alone costs more than its rows
    # running what they shared beyond it (a group's own prompt stays its micro-batch's)
    gains = {j for j in rest if batches[j][0].input_ids.shape[0]
             * (len(cast(tuple[int, ...], keys[j])) - common) < common}
    stretch: list[int] = []
    for i in range(len(keys) + 1):
        if i in gains:
            stretch.append(i)
            continue
        if len(stretch) > 1:
            runs[stretch[0]] = (stretch[-1], _common_length(
                [cast(tuple[int, ...], keys[j]) for j in stretch]))
        stretch = []
    return runs


def _common_length(openings: Sequence[Sequence[int]]) -> int:
    """How many tokens every one of `openings` starts with."""
    first = openings[0]
    n = min(len(o) for o in openings)
    for o in openings[1:]:
        n = next((k for k in range(n) if o[k] != first[k]), n)
    return n


def _cache_keyword(model: Any) -> str:
    """The name a decoder's forward takes its KV cache under: transformers 5 renamed
    `past_key_values` to `cache` (the old name warns, and is removed in 5.40); releases before
    the rename know only `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _prefix_ids(batch: Batch, shared: int) -> Tensor:
    """The `shared` tokens every prompt opens with, [1, shared]."""
    return batch.input_ids[:1, _prompt_starts(batch)[0]:][:, :shared]


def _rows_after_prefix(batch: Batch, shared: int) -> tuple[Tensor, Tensor, Tensor]:
    """Each row without its first `shared` prompt tokens and without its last token (which
    predicts nothing): ids, attention mask (its left padding moved after the prefix) and the
    positions each token has in a full pass, each [B, width - shared - 1]."""
    b, width = batch.input_ids.shape
    # row i without its prefix columns [start_i, start_i + shared): left pads, tail, completion
    cols = torch.arange(width - shared, device=batch.input_ids.device).expand(b, -1)
    cols = cols + shared * (cols >= _prompt_starts(batch)[:, None])
    rest_ids = batch.input_ids.gather(1, cols)[:, :-1]
    rest_mask = batch.attention_mask.gather(1, cols)[:, :-1]
    positions = (shared + rest_mask.cumsum(1) - 1).clamp(min=shared)
    return rest_ids, rest_mask, positions


def _packable(hf: Any) -> bool:
    """Whether the attention takes a ready 4D mask (eager and SDPA do; flash attention not)."""
    return getattr(hf.config, "_attn_implementation", "sdpa") in ("sdpa", "eager")


def _hidden_packed(hf: Any, batch: Batch, shared: int) -> Tensor:
    """As `_hidden_with_shared_prefix`, in one pass: the prefix once, then every row's rest,
    packed into one sequence of batch 1, with a mask that lets each row's tokens see the
    prefix and the tokens of their own row before them (and positions as in a full pass).

    No cache: each layer runs once per micro-batch, and the prefix's gradient flows through
    the layer's own output. That is what FSDP2 needs, which gathers a layer's weights for the
    backward from a hook on that output; the attention is over the packed length (the masked
    pairs cost compute, not memory with SDPA), a small part of a layer's work at these
    lengths."""
    p, b = batch.prompt_len, batch.input_ids.shape[0]
    rest_ids, rest_mask, positions = _rows_after_prefix(batch, shared)
    w = rest_ids.shape[1]
    device = rest_ids.device
    ids = torch.cat([_prefix_ids(batch, shared)[0], rest_ids.reshape(-1)])[None]  # [1, L]
    pos = torch.cat([torch.arange(shared, device=device), positions.reshape(-1)])[None]
    row = torch.cat([torch.full((shared,), -1, device=device),
                     torch.arange(b, device=device).repeat_interleave(w)])  # -1: the prefix
    real = torch.cat([torch.ones(shared, dtype=torch.bool, device=device),
                      rest_mask.reshape(-1).bool()])
    idx = torch.arange(len(row), device=device)
    # query q sees key k: k is at or before q, and k is the prefix or a real token of q's row
    sees = (idx[None, :] <= idx[:, None]) & real[None, :] & (
        (row[None, :] == -1) | (row[None, :] == row[:, None]))
    sees |= torch.eye(len(row), dtype=torch.bool, device=device)  # a pad sees itself: no NaN
    mask: Tensor = sees[None, None]
    if hf.config._attn_implementation == "eager":  # added to the scores
        mask = torch.zeros(mask.shape, dtype=hf.dtype, device=device).masked_fill(
            ~mask, torch.finfo(hf.dtype).min)
    hidden = hf.base_model(input_ids=ids, position_ids=pos, attention_mask=mask,
                           use_cache=False).last_hidden_state  # [1, L, H]
    rest = hidden[0, shared:].reshape(b, w, -1)
    return rest[:, p - 1 - shared :]


@cache
def _read_only_layer() -> type:
    """A cache layer holding the prefix's keys and values that `update` never writes: it
    returns them followed by the new ones, as a growing cache would, and keeps nothing."""
    from transformers.cache_utils import DynamicLayer

    class _ReadOnlyPrefix(DynamicLayer):  # type: ignore[misc]
        def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any
                   ) -> tuple[Tensor, Tensor]:
            keys: Any = self.keys
            values: Any = self.values
            return (torch.cat([keys, key_states], dim=-2),
                    torch.cat([values, value_states], dim=-2))

    return _ReadOnlyPrefix


def _read_only(cache: Any, rows: int) -> bool:
    """The prefix's cache repeated for `rows` rows and made read-only, in place, where every
    layer's cache is the plain growing kind (not, say, a sliding window's); else only
    repeated (the rows' pass then runs without checkpointing). Whether it was made read-only.
    """
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        cache.batch_repeat_interleave(rows)
        return False
    read_only = _read_only_layer()
    for layer in layers:
        layer.__class__ = read_only  # the same state; only `update` differs
        layer.keys = layer.keys.expand(rows, -1, -1, -1)
        layer.values = layer.values.expand(rows, -1, -1, -1)
    return True


@contextmanager
def _cache_kept(hf: Any, on: bool) -> Iterator[None]:
    """Decoder layers keep a read-only cache under checkpointing (transformers' flag for
    layers that only read theirs, from 5.2x on; before it, the rows' pass is not
    checkpointed) for the passes inside."""
    layers = decoder_layers(hf) if on else []
    try:
        for m in layers:
            m._can_checkpoint_with_cache = True
        yield
    finally:
        for m in layers:
            del m._can_checkpoint_with_cache  # back to the class's own value
