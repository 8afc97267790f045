"""The update on several ranks.

trainer/distributed.py wraps the policy (DDP for LoRA, FSDP2 for full weights); every rank gets
all the update's samples and runs its share of the micro-batches (`rank_share`). The normaliser
is the whole update's, so the ranks' losses sum to the one-process loss; DDP and FSDP2 average
gradients over the W ranks, so each rank's loss is multiplied by W, and the averaged gradient is
the one-process gradient. The clipped norm is of that gradient.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

import torch

from conductor_engine.trainer.grpo._compute import _hf
from conductor_engine.trainer.grpo._logprobs import LogProbs
from conductor_engine.trainer.grpo._prefix import _packable
from conductor_engine.trainer.grpo._samples import Batch, Sample


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
