"""Where the local model runs, and in what precision.

CONDUCTOR_LOCAL_DEVICE picks the device: `auto` (the default) uses the first CUDA GPU when torch
sees one and the CPU otherwise; `cpu` or `cuda` (or `cuda:N`) force one. On a GPU the weights are
bfloat16 (as Qwen2.5 and SmolLM2 are published; half the memory and the GPU's fast matmuls); on
the CPU they stay float32, so CPU results are what they always were.
"""

from __future__ import annotations

import os
from importlib.util import find_spec
from typing import Any

from conductor_engine.engine.providers.base import AgentCallError
from conductor_engine.engine.providers.local.errors import LOAD_FAILED

DEVICE_ENV = "CONDUCTOR_LOCAL_DEVICE"
"""auto | cpu | cuda | cuda:N (default auto)."""


def device_setting() -> str:
    """The requested device, as written in CONDUCTOR_LOCAL_DEVICE (default `auto`)."""
    return os.environ.get(DEVICE_ENV, "auto").strip().lower() or "auto"


def choose_device(agent_id: str, setting: str | None = None) -> Any:
    """The torch.device the local model runs on, or a non-retryable AgentCallError saying what
    to do when the setting cannot be met (`cuda` on a machine where torch sees no GPU)."""
    import torch

    wanted = device_setting() if setting is None else setting
    if wanted == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if wanted == "cpu":
        return torch.device("cpu")
    if wanted == "cuda" or wanted.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise AgentCallError(
                f"agent {agent_id}: {DEVICE_ENV}={wanted} but torch sees no CUDA GPU here "
                f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); install a CUDA "
                f"build of torch, or set {DEVICE_ENV}=cpu (or auto)",
                retryable=False,
                kind=LOAD_FAILED,
            )
        return torch.device(wanted)
    raise AgentCallError(
        f"agent {agent_id}: {DEVICE_ENV}={wanted!r} is not a device; set it to auto, cpu, "
        f"cuda or cuda:N",
        retryable=False,
        kind=LOAD_FAILED,
    )


def weights_dtype(device: Any) -> Any:
    """bfloat16 on a GPU, float32 on the CPU (where bfloat16 matmuls are slow and would change
    every CPU result)."""
    import torch

    return torch.bfloat16 if device is not None and device.type == "cuda" else torch.float32


def placement(device: Any) -> dict[str, Any]:
    """`from_pretrained`'s options for `device`: its dtype, and on a GPU a device_map, so the
    weights load straight onto the GPU rather than through the CPU's memory first (it needs
    accelerate; without it the caller's `.to(device)` moves them after loading)."""
    options: dict[str, Any] = {"dtype": weights_dtype(device)}
    if device is not None and device.type == "cuda" and find_spec("accelerate") is not None:
        options["device_map"] = str(device)
    return options
