"""Our GRPO samples laid out as TRL's `GRPOTrainer._generate_and_score_completions` lays out a
batch, so that `GRPOTrainer.compute_loss` can run on exactly the batch our trainer sees: shared
by the agreement test (tests/unit/trainer/test_grpo_trl.py) and the throughput benchmark
(tests/benchmarks/bench_trainer.py).
Needs torch and trl, imported by the caller's choice (this module imports trl lazily).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from conductor_engine.engine.contracts.training import LossConfig
from conductor_engine.trainer.grpo import Sample


def trl_inputs(samples: Sequence[Sample], cfg: LossConfig, *, pad_id: int,
               ref_logprobs: torch.Tensor | None = None) -> dict[str, Any]:
    """Prompts padded left, completions right; truncated completions masked under
    cfg.mask_truncated; behaviour log-probs when the samples carry them; the reference's
    log-probs when beta > 0; `num_items_in_batch`, the completion tokens of the whole batch."""
    from trl.trainer.utils import pad

    def padded(rows: list[list[Any]], side: str, value: int = 0, **kw: Any) -> Any:
        return pad([torch.tensor(r, **kw) for r in rows], padding_value=value, padding_side=side)

    completion_mask = padded([[1] * len(s.completion_ids) for s in samples], "right")
    if cfg.mask_truncated:
        truncated = torch.tensor([s.truncated for s in samples])
        completion_mask = completion_mask * (~truncated).unsqueeze(1).int()
    inputs = {
        "prompt_ids": padded([s.prompt_ids for s in samples], "left", pad_id),
        "prompt_mask": padded([[1] * len(s.prompt_ids) for s in samples], "left"),
        "completion_ids": padded([s.completion_ids for s in samples], "right", pad_id),
        "completion_mask": completion_mask,
        "advantages": torch.tensor([s.advantage for s in samples]),
        "num_items_in_batch": completion_mask.sum(),
    }
    if samples[0].behaviour_logprobs is not None:
        inputs["old_per_token_logps"] = padded(
            [s.behaviour_logprobs or [] for s in samples], "right", dtype=torch.float32)
    if cfg.beta > 0:
        inputs["ref_per_token_logps"] = ref_logprobs
    return inputs
