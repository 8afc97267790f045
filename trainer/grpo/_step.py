"""One update: micro-batches, gradient accumulation, clipping and the optimiser step.

`train_step` runs `cfg.steps_per_update` optimiser steps over the update's samples, each
accumulating every micro-batch's gradient of the loss (trainer/grpo/_loss.py) over log-probs
(trainer/grpo/_logprobs.py), checkpointed where memory planning says so
(trainer/grpo/_memory.py), on this rank's share of the micro-batches
(trainer/grpo/_sharding.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch
from torch import Tensor

from conductor_engine.engine.contracts.training import LossConfig, StepMetrics
from conductor_engine.trainer.grpo._compute import (
    Compute,
    _autocast,
    _checkpointed,
    _hf,
    compute_of,
)
from conductor_engine.trainer.grpo._logprobs import per_token_logprobs
from conductor_engine.trainer.grpo._loss import grpo_loss, loss_normaliser
from conductor_engine.trainer.grpo._memory import (
    _after_oom,
    _measure,
    _needs_checkpointing,
    _pass_tokens,
)
from conductor_engine.trainer.grpo._prefix import GroupPrefix, _group_runs, _prefix_ids
from conductor_engine.trainer.grpo._reference import Reference
from conductor_engine.trainer.grpo._samples import Batch, Sample, collate
from conductor_engine.trainer.grpo._sharding import (
    _gradient_sync,
    _packed_when_sharded,
    _ranks,
    rank_share,
)


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
    ref_model: Reference | None = None,
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
    `ref_model` is the frozen reference for beta > 0 (trainer/grpo/_reference.py: the base, a
    peft model's adapter disabled, or a version's weights; trainer.policy.reference_model).
    Passes run as `compute_of(model)` says (autocast, checkpointing); on several ranks (`model`
    wrapped by trainer/distributed.py) each rank runs its share (`rank_share`) and every rank
    ends with the same weights.
    """
    started = time.perf_counter()
    if cfg.beta > 0 and ref_model is None:
        raise ValueError("beta > 0 needs a reference model")

    def done(skipped: str | None = None, **values: Any) -> StepMetrics:
        return StepMetrics(samples=len(samples), seconds=time.perf_counter() - started,
                           skipped=skipped, **values)

    if not any(s.has_signal for s in samples):
        return done("every advantage is 0: no learning signal")
    live = [s for s in samples if not (cfg.mask_truncated and s.truncated)
            and (s.has_signal or cfg.beta > 0)]
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
        with torch.no_grad(), ref_model.active() as ref, _autocast(device, compute):
            refs = [per_token_logprobs(ref, b, temperature=cfg.temperature) for b, _ in batches]
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
