"""GRPO, top to bottom: samples -> advantages -> batch -> log-probs -> loss -> optimiser step.

The public names; each concern is a module of its own, read in this order:

- trainer/grpo/_samples.py: `Sample` (one completion to train on) and `Batch` (`collate`).
- trainer/grpo/_advantages.py: group and batch advantages.
- trainer/grpo/_shapes.py: credit per plan shape, per-token advantages.
- trainer/grpo/_loss.py: the method, with its equations: `grpo_loss` and its normaliser.
- trainer/grpo/_reference.py: the KL term's `Reference` (the base, or a version's weights).
- trainer/grpo/_logprobs.py: `per_token_logprobs`, and `LogProbs` for DDP and FSDP2 to wrap.
- trainer/grpo/_prefix.py: the shared prompt opening run once (`GroupPrefix`).
- trainer/grpo/_compute.py: mixed precision and checkpointing (`Compute`).
- trainer/grpo/_memory.py: whether a micro-batch fits the device without checkpointing.
- trainer/grpo/_sharding.py: the update on several ranks (`rank_share`).
- trainer/grpo/_step.py: `train_step`, accumulation, clipping, the optimiser step.

The configuration (`LossConfig`) and the step report (`StepMetrics`) are defined, free of torch,
in engine/contracts/training.py, so that workflows can carry them; they are re-exported here.
"""

from conductor_engine.engine.contracts.training import LossConfig, StepMetrics
from conductor_engine.trainer.grpo._advantages import batch_advantages, group_advantages
from conductor_engine.trainer.grpo._compute import Compute, compute_of, decoder_layers, set_compute
from conductor_engine.trainer.grpo._logprobs import LogProbs, per_token_logprobs
from conductor_engine.trainer.grpo._loss import grpo_loss, loss_normaliser
from conductor_engine.trainer.grpo._memory import fits
from conductor_engine.trainer.grpo._reference import Reference
from conductor_engine.trainer.grpo._samples import Batch, Sample, collate, misfit_choice
from conductor_engine.trainer.grpo._sharding import rank_share
from conductor_engine.trainer.grpo._step import make_optimizer, train_step

__all__ = [
    "Batch", "Compute", "LogProbs", "LossConfig", "Reference", "Sample", "StepMetrics",
    "batch_advantages", "collate", "compute_of", "decoder_layers", "fits", "group_advantages",
    "grpo_loss", "loss_normaliser", "make_optimizer", "misfit_choice", "per_token_logprobs",
    "rank_share", "set_compute", "train_step",
]
