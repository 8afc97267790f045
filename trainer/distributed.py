"""Training on several GPUs: one trainer service over the ranks `torchrun` starts.

    torchrun --nproc-per-node N --no-python conductor trainer

Rank 0 is the trainer service as on one GPU: it polls Temporal, selects the rollouts and
publishes versions. The other ranks poll nothing; they wait for rank 0's commands (load a
policy, train on these samples, save) on a control channel and run each in step with it
(trainer/service.py `follow`). Every rank holds the same policy:

    LoRA  the whole model on every rank, the adapter's gradients all-reduced (DDP)
    full  every weight, gradient and AdamW state sharded over the ranks (FSDP2 `fully_shard`,
          one unit per decoder layer): 7B at float32 with AdamW (~112 GB) fits 2 x 80 GB

Each rank gets every sample of an update and runs its share of the micro-batches
(trainer/grpo/_sharding.py `rank_share`), so one update on N ranks gives the weights one process
gives.
Rank 0 writes checkpoints and optimiser state in the one-process formats (trainer/policy.py),
gathered from the shards under FSDP2, so the local provider and vLLM load them unchanged.

On CUDA the ranks talk over NCCL, each on the GPU of its LOCAL_RANK; on CPU (the tests) over
gloo. The control channel is a gloo group either way, with a long timeout: the other ranks
wait there between updates for as long as no update comes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from conductor_engine.trainer.grpo import LogProbs, decoder_layers

__all__ = ["Ranks", "prepare", "release", "setup", "sharded"]

# how long the other ranks wait for rank 0's next command: an idle trainer is not a failure
IDLE_TIMEOUT = timedelta(days=30)


@dataclass
class Ranks:
    """This process's place among the trainer's ranks, and the control channel to the others."""

    rank: int = 0
    world: int = 1
    control: Any = field(default=None, repr=False)  # the gloo group commands travel on

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def send(self, command: Any) -> None:
        """Rank 0: hand `command` (any picklable value; None: stop) to every other rank."""
        if self.world > 1:
            dist.broadcast_object_list([command], src=0, group=self.control)

    def receive(self) -> Any:
        """Another rank: the next command rank 0 sends (blocks until it comes)."""
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]


_joined: Ranks | None = None


def setup() -> Ranks:
    """Join the ranks `torchrun` started (WORLD_SIZE, RANK, LOCAL_RANK in the environment), or
    one rank alone when it did not. Idempotent."""
    global _joined
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world < 2:
        return Ranks()
    if _joined is None:
        if not dist.is_initialized():
            if torch.cuda.is_available():
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        control = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
        _joined = Ranks(rank=dist.get_rank(), world=dist.get_world_size(), control=control)
    return _joined


def release() -> None:
    """Leave the process group. Rank 0, stopping, first tells the other ranks to stop (their
    `receive` gets None); each of them leaves too (`follow`), since a rank that exits still in
    the group can abort in its teardown (SIGABRT, "terminate called without an active
    exception", seen once in the test suite under load)."""
    global _joined
    if _joined is not None:
        if _joined.leader:
            _joined.send(None)
        dist.destroy_process_group()
        _joined = None


def prepare(model: torch.nn.Module, *, lora: bool) -> torch.nn.Module:
    """The module train_step runs on this rank: `model` itself alone, else wrapped for the
    ranks (DDP for LoRA, FSDP2 for full weights) around `LogProbs`, whose forward is the whole
    log-prob computation, so the wrapper's hooks see every pass. FSDP2 shards `model` in place
    (its parameters become DTensor shards); make the optimiser after this."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return model
    if lora:
        from torch.nn.parallel import DistributedDataParallel

        device = next(p for p in model.parameters() if p.requires_grad).device
        # the buffers (rotary frequencies) are the same on every rank: nothing to broadcast
        return DistributedDataParallel(
            LogProbs(model), device_ids=[device.index] if device.type == "cuda" else None,
            broadcast_buffers=False, gradient_as_bucket_view=True)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from conductor_engine.trainer.grpo import compute_of

    # under bf16-mixed: gather the weights in bfloat16, reduce gradients in float32 (on the
    # CPU too, where the tests run it, so the path CUDA takes is the one tested)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if compute_of(model).autocast == torch.bfloat16 else MixedPrecisionPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=mp)
    root = LogProbs(model)
    fully_shard(root, mp_policy=mp)  # embeddings, final norm and head: the root's unit
    return root


def sharded(model: torch.nn.Module) -> bool:
    """Whether `model`'s parameters are FSDP2 shards (so saving gathers them)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule) or any(isinstance(m, FSDPModule)
                                                 for m in model.modules())
