"""The reference the KL term measures the policy against (beta > 0), and how it is run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass
class Reference:
    """What the KL term (beta > 0) measures the policy against: `model`, run under `active()`.

    `adapter` None: `model` as it is, except that a peft model runs with its adapter disabled,
    i.e. as its base. `adapter` given (a LoRA reference version): the policy's own model, with
    these adapter weights copied into its adapter for the reference's passes and its own put
    back after, so a reference version costs one adapter's memory, not a second model.
    """

    model: torch.nn.Module
    adapter: dict[str, torch.Tensor] | None = None

    @contextlib.contextmanager
    def active(self) -> Iterator[torch.nn.Module]:
        if self.adapter is None:
            disable = getattr(self.model, "disable_adapter", None)
            with disable() if disable is not None else contextlib.nullcontext():
                yield self.model
            return
        live = dict(self.model.named_parameters())
        own = {name: live[name].detach().clone() for name in self.adapter}
        with torch.no_grad():
            for name, weight in self.adapter.items():
                live[name].copy_(weight)
        try:
            yield self.model
        finally:
            with torch.no_grad():
                for name, weight in own.items():
                    live[name].copy_(weight)
