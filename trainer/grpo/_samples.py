"""What an update trains on: a `Sample` per completion, and a `Batch` of them as tensors.

A sample carries its prompt and completion tokens, its advantage, the behaviour log-probs it was
sampled with, and what a plan grammar did to it (tokens it forced, choices it narrowed);
`collate` pads samples into the layout TRL uses, so every completion starts at one column.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

import torch
from torch import Tensor


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
    # token's log-prob is over those, as it was sampled (see trainer/grpo/_loss.py)
    choices: dict[int, list[int]] | None = None
    # per completion token, its own advantage (credit per shape, trainer/grpo/_shapes.py);
    # None: every token takes `advantage`
    token_advantages: list[float] | None = None

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("a sample needs a prompt: the first completion token needs a prefix")
        for name, values in (("behaviour log-probs", self.behaviour_logprobs),
                             ("forced flags", self.forced),
                             ("token advantages", self.token_advantages)):
            if values is not None and len(values) != len(self.completion_ids):
                raise ValueError(f"{len(values)} {name} for {len(self.completion_ids)} "
                                 f"completion tokens")
        misfit = misfit_choice(self.choices, self.completion_ids)
        if misfit is not None:
            raise ValueError(f"choice at completion token {misfit} does not hold the token "
                             f"sampled there")

    @property
    def has_signal(self) -> bool:
        """Whether any token has a non-zero advantage."""
        if self.token_advantages is not None:
            return any(a != 0 for a in self.token_advantages)
        return self.advantage != 0

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
    # [B, T] per-token advantages where any sample has its own (else None: `advantages`)
    token_advantages: Tensor | None = None
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
        token_advantages=None if all(s.token_advantages is None for s in samples) else pad(
            [s.token_advantages if s.token_advantages is not None
             else [s.advantage] * len(s.completion_ids) for s in samples],
            "right", dtype=torch.float32),
    )


def _choice_ids(samples: Sequence[Sample], width: int) -> Tensor:
    """[B, T, K]: at each choice the allowed token ids, padded with -1 (K = the largest set)."""
    k = max((len(a) for s in samples for a in (s.choices or {}).values()), default=0)
    out = torch.full((len(samples), width, k), -1, dtype=torch.long)
    for row, s in enumerate(samples):
        for t, allowed in (s.choices or {}).items():
            out[row, t, : len(allowed)] = torch.tensor(allowed)
    return out
