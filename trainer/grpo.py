"""GRPO, top to bottom: samples -> advantages -> batch -> log-probs -> loss -> optimiser step.

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

The configuration (`LossConfig`) and the step report (`StepMetrics`) are defined, free of torch,
in engine/contracts/training.py, so that workflows can carry them; they are re-exported here.
"""

from __future__ import annotations

import inspect
import math
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, fields
from functools import cache, partial
from typing import Any, Literal, cast

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from conductor_engine.engine.contracts.training import LossConfig, StepMetrics

__all__ = [
    "Batch", "Compute", "LogProbs", "LossConfig", "Sample", "StepMetrics", "batch_advantages",
    "collate", "compute_of", "group_advantages", "grpo_loss", "loss_normaliser",
    "make_optimizer", "misfit_choice", "per_token_logprobs", "set_compute", "train_step",
]

# ---------------------------------------------------------------------------------- samples


@dataclass
class Sample:
    """One completion to train on: a rollout's prompt and completion tokens and its advantage."""

    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    behaviour_logprobs: list[float] | None = None  # per completion token, as sampled; None: unknown
    truncated: bool = False  # the completion hit max_tokens (no end-of-turn token)
    # per completion token: the plan grammar allowed no other token. The policy that sampled
    # (the model under the grammar) gave it probability 1, so its policy gradient is 0 and it
    # stays out of the loss and the token count; it is still read as context.
    forced: list[bool] | None = None
    # completion token index -> the few tokens the plan grammar allowed there (a choice); the
    # token's log-prob is over those, as it was sampled (see the module docstring)
    choices: dict[int, list[int]] | None = None

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("a sample needs a prompt: the first completion token needs a prefix")
        for name, values in (("behaviour log-probs", self.behaviour_logprobs),
                             ("forced flags", self.forced)):
            if values is not None and len(values) != len(self.completion_ids):
                raise ValueError(f"{len(values)} {name} for {len(self.completion_ids)} "
                                 f"completion tokens")
        misfit = misfit_choice(self.choices, self.completion_ids)
        if misfit is not None:
            raise ValueError(f"choice at completion token {misfit} does not hold the token "
                             f"sampled there")

    @property
    def trained_tokens(self) -> int:
        """Completion tokens in the loss: all but the forced ones."""
        return len(self.completion_ids) - sum(self.forced or ())


def misfit_choice(choices: dict[int, list[int]] | None, completion_ids: Sequence[int]
                  ) -> int | None:
    """The first choice position that is past the completion or does not hold the token sampled
    there (so the record is not this completion's), or None when every choice fits."""
    for k, allowed in (choices or {}).items():
        if not 0 <= k < len(completion_ids) or completion_ids[k] not in allowed:
            return k
    return None


def group_advantages(rewards: Sequence[float], *, scale: bool) -> list[float]:
    """Group-relative advantages A_i = r_i - mean(r), divided by (std(r) + 1e-4) when `scale`.

    std is the sample standard deviation (Bessel's correction, n - 1), as TRL's `nanstd`; a group
    of one has no spread and gets A = 0. `scale=False` is Dr. GRPO's unbiased choice. A group whose
    rewards are all equal gets zeros either way: it carries no learning signal.
    """
    mean = statistics.fmean(rewards)
    centred = [r - mean for r in rewards]
    if not scale:
        return centred
    if len(rewards) < 2:
        return [0.0] * len(rewards)
    std = statistics.stdev(rewards)
    return [a / (std + 1e-4) for a in centred]


def batch_advantages(groups: Sequence[Sequence[float]], *, scale: bool) -> list[list[float]]:
    """Advantages against the whole update's rewards (REINFORCE++'s global baseline), per group:

        A_i = (r_i - mean(r over every rollout of the update)) / (std(r over the same) + 1e-4)

    (without the division when not `scale`). Unlike `group_advantages`, a group whose rollouts
    all scored alike keeps a signal: all failed, its choices are pushed down; all right, up.
    The price is variance between tasks of unequal difficulty, which a group baseline removes.
    """
    flat = [r for g in groups for r in g]
    if len(flat) < 2:
        return [[0.0] * len(g) for g in groups]
    mean = statistics.fmean(flat)
    div = statistics.stdev(flat) + 1e-4 if scale else 1.0
    return [[(r - mean) / div for r in g] for g in groups]


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


# ------------------------------------------------------------------------------------ batch


@dataclass
class Batch:
    """Samples as tensors, laid out as TRL lays them: prompts padded on the left, completions on
    the right, so every completion starts at column `prompt_len` of `input_ids`."""

    input_ids: Tensor  # [B, P + T]  prompt + completion token ids
    attention_mask: Tensor  # [B, P + T]  1 on real tokens
    completion_mask: Tensor  # [B, T]   1 on completion tokens
    loss_mask: Tensor  # [B, T]   1 on completion tokens in the loss (not forced by a grammar)
    advantages: Tensor  # [B]
    old_logprobs: Tensor  # [B, T]   behaviour log-probs (0 where unknown)
    has_old: Tensor  # [B] bool  rows whose behaviour log-probs are known
    truncated: Tensor  # [B] bool
    choice_ids: Tensor  # [B, T, K]  at a choice, the allowed token ids (-1 pads); K may be 0
    # how the prompt opening the rows share runs once: read as a KV cache, or packed into one
    # sequence with the rows (under FSDP2); "none": every row runs its whole prompt
    prefix: Literal["cache", "packed", "none"] = "cache"

    @property
    def prompt_len(self) -> int:
        return self.input_ids.shape[1] - self.completion_mask.shape[1]

    def to(self, device: torch.device | str) -> Batch:
        moved: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            moved[f.name] = value.to(device) if isinstance(value, Tensor) else value
        return Batch(**moved)


def collate(samples: Sequence[Sample], pad_id: int) -> Batch:
    """Pad a list of samples into one Batch."""

    def pad(rows: list[list[Any]], side: str, value: float = 0, dtype: torch.dtype = torch.long
            ) -> Tensor:
        tensors = [torch.tensor(r, dtype=dtype) for r in rows]
        return torch.nn.utils.rnn.pad_sequence(tensors, batch_first=True, padding_value=value,
                                               padding_side=side)

    prompts = [s.prompt_ids for s in samples]
    completions = [s.completion_ids for s in samples]
    prompt_mask = pad([[1] * len(p) for p in prompts], "left")
    completion_mask = pad([[1] * len(c) for c in completions], "right")
    return Batch(
        input_ids=torch.cat([pad(prompts, "left", pad_id), pad(completions, "right", pad_id)], 1),
        attention_mask=torch.cat([prompt_mask, completion_mask], 1),
        completion_mask=completion_mask,
        loss_mask=pad([[0 if f else 1 for f in (s.forced or [False] * len(s.completion_ids))]
                       for s in samples], "right"),
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32),
        old_logprobs=pad([s.behaviour_logprobs or [0.0] * len(s.completion_ids) for s in samples],
                         "right", dtype=torch.float32),
        has_old=torch.tensor([s.behaviour_logprobs is not None for s in samples]),
        truncated=torch.tensor([s.truncated for s in samples]),
        choice_ids=_choice_ids(samples, completion_mask.shape[1]),
    )


def _choice_ids(samples: Sequence[Sample], width: int) -> Tensor:
    """[B, T, K]: at each choice the allowed token ids, padded with -1 (K = the largest set)."""
    k = max((len(a) for s in samples for a in (s.choices or {}).values()), default=0)
    out = torch.full((len(samples), width, k), -1, dtype=torch.long)
    for row, s in enumerate(samples):
        for t, allowed in (s.choices or {}).items():
            out[row, t, : len(allowed)] = torch.tensor(allowed)
    return out


# -------------------------------------------------------------------------------- log-probs

# The prompt opening the micro-batches of an update share (the conductor's instructions) runs
# once per optimiser step for all of them where their own openings differ beyond it
# (`_group_runs`, `GroupPrefix`); False: only runs of micro-batches with one opening share it
# (tests/benchmarks/bench_iteration.py --baseline turns it off).
SHARE_UPDATE_PREFIX = True

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
    checks) at a fraction of the compute.

    Under gradient checkpointing, transformers drops a cache a layer would write (its backward
    replay would append the keys twice). So the prefix, one row, runs without checkpointing
    (its activations are 1/B of the rows'), and the rows read the prefix through a cache that
    is never written (`_ReadOnlyPrefix`): replaying a layer reads the same keys again, which
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


# ------------------------------------------------------------------------------------- loss


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
    adv = batch.advantages[:, None]
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


# ------------------------------------------------------------------------------ how it runs


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
    autocast (per_token_logprobs).

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


def _autocast(device: torch.device, compute: Compute) -> Any:
    if compute.autocast is None:
        return nullcontext()
    return torch.autocast(device.type, dtype=compute.autocast)


# ------------------------------------------------------------------------------------ ranks
#
# On several ranks (trainer/distributed.py wraps the policy: DDP for LoRA, FSDP2 for full
# weights) every rank gets all the update's samples and runs its share of the micro-batches.
# The normaliser is the whole update's, so the ranks' losses sum to the one-process loss; DDP
# and FSDP2 average gradients over the W ranks, so each rank's loss is multiplied by W, and
# the averaged gradient is the one-process gradient. The clipped norm is of that gradient.


def _ranks(model: torch.nn.Module) -> tuple[int, int]:
    """(this rank, world size) when `model` is wrapped for several ranks, else (0, 1)."""
    import torch.distributed as dist

    wrapped = isinstance(model, LogProbs) or isinstance(getattr(model, "module", None), LogProbs)
    if not (wrapped and dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def _cost(micro: Sequence[Sample]) -> int:
    """Tokens a micro-batch runs: the prompt opening its rows share once, the rest per row."""
    first = micro[0].prompt_ids
    shared = min((next((k for k, (a, b) in enumerate(zip(first, s.prompt_ids, strict=False))
                        if a != b), min(len(first), len(s.prompt_ids)))
                  for s in micro[1:]), default=0)
    return shared + sum(len(s.prompt_ids) + len(s.completion_ids) - shared for s in micro)


def rank_share(micro_batches: Sequence[Sequence[Sample]], rank: int, world: int
               ) -> list[tuple[list[Sample], float]]:
    """This rank's micro-batches, each with its weight in the loss (0 for a filler).

    Every rank runs the same number of them, ceil(M / W), because each forward and backward is
    a collective under FSDP2 (and the last backward under DDP): the largest micro-batch goes
    to the least-loaded rank that still has room, ties to the lower rank, so the ranks carry
    about the same tokens and the split is the same on every rank. A rank left short runs a
    filler (two rows of the smallest micro-batch at weight 0), whose gradient is zero."""
    if world == 1:
        return [(list(m), 1.0) for m in micro_batches]
    per = -(-len(micro_batches) // world)
    loads, owned = [0] * world, [[] for _ in range(world)]  # type: list[int], list[list[int]]
    for i in sorted(range(len(micro_batches)), key=lambda i: (-_cost(micro_batches[i]), i)):
        r = min((r for r in range(world) if len(owned[r]) < per), key=lambda r: (loads[r], r))
        owned[r].append(i)
        loads[r] += _cost(micro_batches[i])
    mine: list[tuple[list[Sample], float]] = [(list(micro_batches[i]), 1.0)
                                              for i in sorted(owned[rank])]
    smallest = min(micro_batches, key=lambda m: (len(m) < 2, _cost(m)))  # rows to share, if any
    return mine + [(list(smallest[:2]), 0.0)] * (per - len(mine))


def _packed_when_sharded(model: torch.nn.Module, batches: list[tuple[Batch, float]]) -> None:
    """Under FSDP2 the shared prefix runs packed with the rows (`_hidden_packed`), not as a
    cache: FSDP2 gathers a layer's weights again for its backward from a hook on the layer's
    output, and a cached prefix's gradient reaches the layer through the keys and values it
    cached instead, to find the weights freed. (DDP keeps whole weights: the cache works.)"""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        for batch, _ in batches:
            batch.prefix = "packed" if _packable(_hf(model)) else "none"


@contextmanager
def _gradient_sync(model: torch.nn.Module, on: bool) -> Iterator[None]:
    """Gradients all-reduced (DDP) or reduce-scattered (FSDP2) in this backward, or only
    accumulated on the rank (every micro-batch but its last)."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(on)
        yield
    elif not on and hasattr(model, "no_sync"):
        with cast(Any, model).no_sync():
            yield
    else:
        yield


# ------------------------------------------------------------------------------------- step


def make_optimizer(model: torch.nn.Module, cfg: LossConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters, as TRL's default (no weight decay, fused on CUDA)."""
    params = [p for p in model.parameters() if p.requires_grad]
    fused = bool(params) and params[0].device.type == "cuda"
    return torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=0.0, fused=fused)


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    samples: Sequence[Sample],
    cfg: LossConfig,
    *,
    ref_model: torch.nn.Module | None = None,
    pad_id: int | None = None,
) -> StepMetrics:
    """One update on `samples`: `cfg.steps_per_update` optimiser steps (mu), each over all the
    samples in micro-batches of `cfg.micro_batch_size`, gradients accumulated (each normalised
    over the whole update), norm clipped to cfg.max_grad_norm.

    The first step is on-policy; later steps reuse the same rollouts, and the ratio r_it against
    the policy that sampled them, clipped to [1 - eps_low, 1 + eps_high], stops a token's
    gradient once its probability has moved that far: GRPO's mu inner iterations (TRL's
    num_iterations). Rows without behaviour log-probs take the first step's as theirs.

    Samples that cannot change the loss are not run at all: those with A = 0 when beta = 0 (their
    loss is identically 0) and truncated ones under `mask_truncated`; they still count in the
    normaliser, as in TRL. The rest run sorted by length, so micro-batches carry little padding,
    and a group's rows together, so each micro-batch runs their shared prompt once. No step is
    taken when every advantage is 0 or the gradient is not finite (`skipped` says why).
    `ref_model` is the frozen reference for beta > 0; a peft model is used with its adapters
    disabled (see trainer.policy.reference_model). Passes run as `compute_of(model)` says
    (autocast, checkpointing); on several ranks (`model` wrapped by trainer/distributed.py)
    each rank runs its share (`rank_share`) and every rank ends with the same weights.
    """
    started = time.perf_counter()
    if cfg.beta > 0 and ref_model is None:
        raise ValueError("beta > 0 needs a reference model")

    def done(skipped: str | None = None, **values: Any) -> StepMetrics:
        return StepMetrics(samples=len(samples), seconds=time.perf_counter() - started,
                           skipped=skipped, **values)

    if all(s.advantage == 0 for s in samples):
        return done("every advantage is 0: no learning signal")
    live = [s for s in samples if not (cfg.mask_truncated and s.truncated)
            and (s.advantage != 0 or cfg.beta > 0)]
    if not live:
        return done("every sample with an advantage is truncated and masked")

    device = next(model.parameters()).device
    if pad_id is None:
        pad_id = getattr(getattr(model, "config", None), "pad_token_id", None) or 0
    normaliser = loss_normaliser(samples, cfg)
    rank, world = _ranks(model)
    share = rank_share(_micro_batches(live, cfg.micro_batch_size, by_prompt=True), rank, world)
    batches = [(collate(m, pad_id).to(device), weight * world) for m, weight in share]
    if world > 1:
        _packed_when_sharded(model, batches)
    compute = compute_of(model)
    refs: list[Tensor | None] = [None] * len(batches)
    if cfg.beta > 0 and ref_model is not None:
        with torch.no_grad(), _as_reference(ref_model), _autocast(device, compute):
            refs = [per_token_logprobs(ref_model, b, temperature=cfg.temperature)
                    for b, _ in batches]
    model.train()
    steps: list[dict[str, float]] = []
    for _ in range(cfg.steps_per_update):
        step = _optimiser_step(model, optimizer, batches, refs, cfg, normaliser, compute)
        steps.append(step)
        if not math.isfinite(step["grad_norm"]):
            values = _mean_metrics(steps)
            return done(f"the gradient norm is {step['grad_norm']}: step {len(steps)} of "
                        f"{cfg.steps_per_update} not taken, nor any after it", **values)
    return done(**_mean_metrics(steps),
                sample_tokens=sum(len(s.prompt_ids) + len(s.completion_ids) for s in live))


def _optimiser_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: list[tuple[Batch, float]],
    refs: list[Tensor | None], cfg: LossConfig, normaliser: float, compute: Compute,
) -> dict[str, float]:
    """Accumulate the gradient of every micro-batch (each loss times its weight: the world size
    on several ranks, 0 for a filler), clip its norm, step (unless not finite).

    Under auto checkpointing on one rank, a micro-batch that runs out of device memory (the
    estimate or the measure was short: fragmentation, a kernel's workspace) does not end the
    update: the gradients accumulated so far are dropped and the step runs again with every
    micro-batch checkpointed, and the bytes per token judged from then on are doubled
    (`_after_oom`). On several ranks the others are inside a collective: it is raised."""
    retry = False
    try:
        totals = _accumulate(model, optimizer, batches, refs, cfg, normaliser, compute, False)
    except torch.OutOfMemoryError:
        if not compute.auto_checkpointing or _ranks(model)[1] > 1:
            raise
        retry = True  # outside the handler, so the failed pass's tensors are freed first
    if retry:
        optimizer.zero_grad(set_to_none=True)
        _after_oom(model, batches[0][0], compute)
        try:
            totals = _accumulate(model, optimizer, batches, refs, cfg, normaliser, compute, True)
        except torch.OutOfMemoryError:
            size = max(len(b.input_ids) for b, _ in batches)
            raise torch.OutOfMemoryError(
                f"out of device memory even with gradient checkpointing on every micro-batch "
                f"of up to {size} rows: lower [loss] micro_batch_size") from None
    params = [p for g in optimizer.param_groups for p in g["params"]]
    norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
    grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    loss_sum, clipped, kl, n_tokens, passed = totals.tolist()
    tokens = max(n_tokens, 1)
    if math.isfinite(grad_norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss": loss_sum, "grad_norm": grad_norm, "tokens": n_tokens,
            "clip_fraction": clipped / tokens, "kl": kl / tokens, "passed_tokens": passed}


def _accumulate(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: list[tuple[Batch, float]],
    refs: list[Tensor | None], cfg: LossConfig, normaliser: float, compute: Compute,
    recompute_all: bool,
) -> Tensor:
    """Every micro-batch's forward and backward, gradients summed into `.grad`: the update's
    totals (loss, clip fraction and kl token-weighted, tokens), over all ranks. Checkpointed
    where auto checkpointing judges it needed, or everywhere with `recompute_all`.

    On one process, a group spread over several micro-batches runs its shared prompt once for
    all of them (`GroupPrefix`): forward before its first micro-batch, backward after its
    last. (On several ranks a group's micro-batches are dealt to different ranks.)"""
    # loss, clip_fraction, kl (token-weighted), tokens; and the tokens the passes ran over
    totals = torch.zeros(5, dtype=torch.float64)
    hf = _hf(model)
    runs = _group_runs(hf, batches) if _ranks(model)[1] == 1 else {}
    prefix: GroupPrefix | None = None
    last = -1  # the index of the current run's last micro-batch
    for i, ((batch, weight), ref) in enumerate(zip(batches, refs, strict=True)):
        device = batch.input_ids.device
        if i in runs:
            last, length = runs[i]
            with _autocast(device, compute):
                prefix = GroupPrefix.run(hf, _prefix_ids(batch, length))
            totals[4] += 2 * prefix.ids.shape[1]  # run now, and again for its backward
        grouped = prefix is not None
        recompute = compute.auto_checkpointing and (recompute_all or _needs_checkpointing(
            model, optimizer, batch, compute, prefix_run=not grouped))
        checkpointed = _checkpointed(hf, recompute) if compute.auto_checkpointing \
            else nullcontext()
        measured = _measure(model, batch, compute, compute.auto_checkpointing and not recompute,
                            prefix_run=not grouped)
        with checkpointed, measured, _gradient_sync(model, i == len(batches) - 1):
            with _autocast(device, compute):
                logprobs = per_token_logprobs(model, batch, temperature=cfg.temperature,
                                              prefix=prefix)
            if not bool(batch.has_old.all()):  # later steps measure their ratio against this one
                batch.old_logprobs = torch.where(batch.has_old[:, None], batch.old_logprobs,
                                                 logprobs.detach())
                batch.has_old = torch.ones_like(batch.has_old)
            loss, m = grpo_loss(logprobs, batch, cfg, ref_logprobs=ref, normaliser=normaliser)
            (loss * weight).backward()
        if prefix is not None and i == last:  # the group's prefix, backward once
            with _autocast(device, compute):
                prefix.backward(hf)
            prefix = None
        totals[4] += (batch.input_ids.numel() - batch.input_ids.shape[0] * prefix.length
                      if prefix is not None else _pass_tokens(hf, batch))
        if weight:
            totals[:4] += torch.tensor([m["loss"], m["clip_fraction"] * m["tokens"],
                                        m["kl"] * m["tokens"], m["tokens"]], dtype=torch.float64)
    if _ranks(model)[1] > 1:
        import torch.distributed as dist

        summed = totals.to(batches[0][0].input_ids.device)  # NCCL reduces device tensors
        dist.all_reduce(summed)  # every rank reports the whole update
        totals = summed.cpu()
    return totals


def _mean_metrics(steps: list[dict[str, float]]) -> dict[str, Any]:
    """One update's report: the steps' means, tokens counted once, and how many steps ran."""
    taken = sum(math.isfinite(s["grad_norm"]) for s in steps)
    means = {k: sum(s[k] for s in steps) / len(steps)
             for k in ("loss", "grad_norm", "clip_fraction", "kl")}
    return {**means, "tokens": int(steps[0]["tokens"]), "steps": taken,
            "passed_tokens": int(sum(s["passed_tokens"] for s in steps))}


def _micro_batches(samples: Sequence[Sample], size: int, *, by_prompt: bool
                   ) -> list[list[Sample]]:
    """Micro-batches of at most `size` samples, sorted by length so they carry little padding.

    With `by_prompt`, the samples of one prompt (a group) go together, so that each micro-batch
    runs its prompt once (see _hidden_with_shared_prefix); prompts with one sample are batched
    as usual.
    """
    def chunks(rows: list[Sample]) -> list[list[Sample]]:
        return [rows[i : i + size] for i in range(0, len(rows), size)]

    def length(s: Sample) -> int:
        return len(s.prompt_ids) + len(s.completion_ids)

    if not by_prompt:
        return chunks(sorted(samples, key=length))
    groups: dict[tuple[int, ...], list[Sample]] = {}
    for s in samples:
        groups.setdefault(tuple(s.prompt_ids), []).append(s)
    shared = [sorted(g, key=length) for g in groups.values() if len(g) > 1]
    alone = sorted((g[0] for g in groups.values() if len(g) == 1), key=length)
    return [c for g in shared for c in chunks(g)] + chunks(alone)


def _as_reference(model: torch.nn.Module) -> Any:
    """A peft model with its adapters switched off is the base model: the reference."""
    disable = getattr(model, "disable_adapter", None)
    return disable() if disable is not None else nullcontext()
