"""How the local provider generates a batch (engine/providers/local/decode.py, sampling.py): the
GPU way (one prefill per group, a static KV cache) gives what the CPU way gives, and a batch
keeps one log-prob per row and step, never a step's logits. Against a one-layer conductor with
SmolLM2's tokenizer (tests/tiny_policy.py), on the CPU."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from conductor_engine.engine.contracts.agent_calls import Message
from conductor_engine.engine.plan.language import plan_json_schema
from conductor_engine.engine.providers import local
from conductor_engine.engine.providers.base import Completion, CompletionRequest
from conductor_engine.engine.providers.local import batching, decode
from conductor_engine.engine.providers.pool import AgentSpec

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None
        for m in ("torch", "transformers", "gguf", "xgrammar")),
    reason="the local extra is not installed (pip install -e '.[local]')",
)


def ask(question: str, max_tokens: int, **kw: Any) -> CompletionRequest:
    return CompletionRequest(messages=[Message(role="user", content=question)],
                             max_tokens=max_tokens, **kw)


async def complete_together(spec: AgentSpec, requests: list[CompletionRequest],
                            monkeypatch: pytest.MonkeyPatch) -> list[Completion]:
    monkeypatch.setattr(batching, "queue", batching.GenerationQueue(16, window_s=0.5))
    return list(await asyncio.gather(*(local.complete(spec, r) for r in requests)))


async def test_one_prefill_per_group_into_a_static_cache_generates_what_generate_does(
    tiny_policy_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two groups (three rows of one prompt under the plan grammar, two of a shorter prompt in
    free text) in one batch: the GPU way runs each prompt once (2 rows through the embedding,
    not 5) and gives every row the tokens, log-probs and grammar records the CPU way gives."""
    spec = AgentSpec(id="tiny", provider="local", model=str(tiny_policy_dir))
    schema = plan_json_schema(["alpha", "bravo"], 2, subtask_max_chars=24)
    batch = [ask("Route this: what is 7 x 8? Answer with a plan.", 40, temperature=0.0,
                 json_schema=schema, schema_name="plan")] * 3
    batch += [ask("Hi", 24, temperature=0.0)] * 2
    loaded = await asyncio.to_thread(local.load_model, spec)
    await complete_together(spec, batch[:1], monkeypatch)  # the grammar compiled: all arrive
    prompts: list[tuple[int, ...]] = []
    hook = loaded.model.get_input_embeddings().register_forward_pre_hook(
        lambda _, args: prompts.append(tuple(args[0].shape)))
    try:
        plain = await complete_together(spec, batch, monkeypatch)
        plain_shapes, prompts[:] = prompts[:], []
        monkeypatch.setattr(decode, "static_on_cpu", True)
        static = await complete_together(spec, batch, monkeypatch)
    finally:
        hook.remove()
    assert batching.queue.batch_sizes == {5: 1}
    width = plain_shapes[0][1]
    assert plain_shapes[0] == (5, width), "the CPU way prefills every row"
    assert prompts[0] == (2, width - 1), "one prefill per distinct prompt, less its last token"
    assert prompts[1] == (5, 1), "then generate's first step: every row's last prompt token"
    assert decode.kept is not None and decode.kept[0][:2] == (loaded.name, 5)
    for p, s in zip(plain, static, strict=True):
        assert s.token_ids == p.token_ids
        assert s.logprobs == pytest.approx(p.logprobs, abs=1e-4)
        assert (s.forced_positions, s.choice_tokens) == (p.forced_positions, p.choice_tokens)
    assert plain[0].text != plain[3].text


def live_tensor_bytes(leave_out: set[int]) -> int:
    """Bytes of every tensor storage alive in the process but those in `leave_out` (the
    weights): what a batch keeps, measured, whoever keeps it."""
    import torch

    seen: set[int] = set()
    total = 0
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor) and obj.device.type == "cpu":
            storage = obj.untyped_storage()
            ptr = storage.data_ptr()
            if ptr and ptr not in seen and ptr not in leave_out:
                seen.add(ptr)
                total += storage.nbytes()
    return total


async def test_a_batch_keeps_memory_per_token_not_per_token_and_vocabulary_entry(
    tiny_policy_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tensors alive at a batch's last forward pass, after 8 and after 32 generated tokens
    of 4 rows: what the 24 more steps added per row and token is far below one row of logits
    (49,152 floats, 192 KiB: `generate`'s output_logits kept that much per row and token). It is
    the cache's keys and values and the recorded log-probs (sampling.StepLogprobs)."""
    spec = AgentSpec(id="tiny", provider="local", model=str(tiny_policy_dir))
    loaded = await asyncio.to_thread(local.load_model, spec)
    weights = {p.untyped_storage().data_ptr() for p in loaded.model.state_dict().values()}
    calls: list[int] = []
    measured: dict[int, int] = {}

    def census(steps: int) -> Any:
        def hook(*_: Any) -> None:
            calls.append(1)
            if len(calls) == steps:  # the forward pass of the last token
                measured[steps] = live_tensor_bytes(weights)
        return hook

    rows = 4
    for steps in (8, 32):
        calls.clear()
        handle = loaded.model.register_forward_pre_hook(census(steps))
        try:
            # unseeded rows share one batch on the CPU
            await complete_together(
                spec, [ask("Write anything at all.", steps, temperature=1.0)] * rows,
                monkeypatch)
        finally:
            handle.remove()
        assert steps in measured, "a row ended early (the random model wrote end of turn)"
    vocab_row = loaded.vocab_size * 4
    per_token = (measured[32] - measured[8]) / (rows * 24)
    print(f"kept per row and token: {per_token:.0f} bytes; a row of logits: {vocab_row}")
    assert per_token < vocab_row / 16, (per_token, vocab_row)
