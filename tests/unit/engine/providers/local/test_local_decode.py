"""How the local provider generates a batch (engine/providers/local/decode.py, sampling.py): the
GPU way (one prefill per group, a static KV cache) gives what the CPU way gives, the opening the
rows share runs once, a seeded plan is the same alone and in a batch, and a batch keeps one
log-prob per row and step, never a step's logits. Against a one-layer conductor with
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
from conductor_engine.engine.plan.prompts import BARE_ROLE, conductor_messages
from conductor_engine.engine.providers import local
from conductor_engine.engine.providers.base import Completion, CompletionRequest
from conductor_engine.engine.providers.local import batching, decode
from conductor_engine.engine.providers.local.chat import prompt_ids
from conductor_engine.engine.providers.pool import AgentSpec, Pool
from tests.paths import ROOT

SIM_POOL = ROOT / "examples" / "sim" / "pool.toml"

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
    ids = [prompt_ids(loaded.tokenizer, r) for r in batch]
    width, shared = max(len(i) for i in ids), decode.shared_prefix(ids)
    assert shared >= decode.SHARED_PREFIX_MIN  # the chat template's system turn, at least
    assert plain_shapes[:2] == [(1, shared), (5, width - shared)], \
        "the CPU way runs the opening every row shares once, then the rest of every row"
    assert prompts[0] == (2, width - 1), "one prefill per distinct prompt, less its last token"
    assert prompts[1] == (5, 1), "then generate's first step: every row's last prompt token"
    assert decode.kept is not None and decode.kept[0][:2] == (loaded.name, 5)
    for p, s in zip(plain, static, strict=True):
        assert s.token_ids == p.token_ids
        assert s.logprobs == pytest.approx(p.logprobs, abs=1e-4)
        assert (s.forced_positions, s.choice_tokens) == (p.forced_positions, p.choice_tokens)
    assert plain[0].text != plain[3].text


async def test_the_gpu_way_pads_rows_on_the_left_only_and_the_cpu_way_runs_their_opening_once(
    tiny_policy_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two prompts of different lengths that open alike (the chat template's system turn):
    the CPU way runs their opening once; the GPU way (a static cache, on a GPU a compiled
    decode step) gets the rows padded on the left only, the layout its per-prompt prefill
    groups and its work count (`GenerationQueue._count`) assume: every attention mask it is
    handed is zeros, then ones."""
    spec = AgentSpec(id="tiny", provider="local", model=str(tiny_policy_dir))
    batch = [ask("Route this: what is 7 x 8? Answer briefly.", 6, temperature=0.0),
             ask("Hi", 6, temperature=0.0)]
    loaded = await asyncio.to_thread(local.load_model, spec)
    ids = [prompt_ids(loaded.tokenizer, r) for r in batch]
    assert decode.opening_run_once(loaded, ids) == decode.shared_prefix(ids) > 0
    masks: list[list[list[int]]] = []

    def seen(_: Any, args: Any, kwargs: dict[str, Any]) -> None:
        mask = kwargs.get("attention_mask")
        if mask is not None and mask.dim() == 2:
            masks.append(mask.long().tolist())

    monkeypatch.setattr(decode, "static_on_cpu", True)
    assert decode.opening_run_once(loaded, ids) == 0
    hook = loaded.model.register_forward_pre_hook(seen, with_kwargs=True)
    try:
        static = await complete_together(spec, batch, monkeypatch)
    finally:
        hook.remove()
    assert batching.queue.batch_sizes == {2: 1} and all(c.text for c in static)
    assert masks, "the model was handed attention masks"
    for mask in masks:
        for row in mask:
            assert row == sorted(row), f"padding after a real token: {row}"


async def test_every_batch_of_every_queue_runs_on_the_process_one_generation_thread(
    tiny_policy_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two bursts of work, each through a queue of its own, a pause between them: the model
    runs on one and the same thread every time. On a GPU the compiled decode step's CUDA
    graphs live in the state of the thread that captured them; a later burst on a fresh
    thread failed inside that step (an AssertionError on an H200)."""
    import threading

    spec = AgentSpec(id="tiny", provider="local", model=str(tiny_policy_dir))
    loaded = await asyncio.to_thread(local.load_model, spec)
    threads: list[threading.Thread] = []  # the objects, kept: a thread id can be reused
    hook = loaded.model.register_forward_pre_hook(
        lambda *_: threads.append(threading.current_thread()))
    try:
        for question in ("Hi", "What is 7 x 8?"):
            await complete_together(spec, [ask(question, 4, temperature=0.0)] * 2, monkeypatch)
            await asyncio.sleep(0.2)  # the first burst's drain has ended
    finally:
        hook.remove()
    assert threads and all(t is threads[0] for t in threads), {t.name for t in threads}
    assert threads[0] is not threading.current_thread()


def plan_requests(questions: list[str], seeds: list[int | None], max_tokens: int = 48
                  ) -> list[CompletionRequest]:
    """Plan requests as the plan activity writes them (activities/plan.py): the conductor's
    instructions, then each its own draw of the sim pool (2 to 4 agents, in its own order) and
    its question, under the plan grammar, at temperature 1."""
    import random

    agents = Pool.load(SIM_POOL).available()
    out = []
    for k, (question, seed) in enumerate(zip(questions, seeds, strict=True)):
        drawn = random.Random(k).sample(agents, 2 + k % 3)
        out.append(CompletionRequest(
            messages=conductor_messages(question, drawn, max_steps=2, json_mode=True),
            temperature=1.0, max_tokens=max_tokens, seed=seed, schema_name="plan",
            json_schema=plan_json_schema([a.id for a in drawn], 2, subtask_max_chars=8)))
    return out


async def test_a_seeded_plan_is_the_same_alone_and_in_a_batch_of_8_whose_opening_runs_once(
    tiny_policy_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight plan requests that wait together (six seeded, two not, prompts of different
    lengths) are one batch: the conductor's instructions, which every prompt opens with, run
    once as one row, then the rest of the 8 rows. Each seeded plan is the one its request gets
    alone: the same tokens, forced steps and choice sets, its log-probs within 1e-5 (the
    batched matrix products sum in another order: decode.py, batching.Job.batch_key)."""
    monkeypatch.setattr(batching, "batch_seeded", True)  # CONDUCTOR_LOCAL_BATCH_SEEDED=1
    spec = AgentSpec(id="tiny", provider="local", model=str(tiny_policy_dir))
    questions = ["What is 7 x 8?", "Who wrote Hamlet?", "Translate 'cat' into French.",
                 "Sort these numbers: 5 3 9 1.", "What is the boiling point of water?",
                 "Name a prime number above 50.", "Is 91 prime?", "Spell 'necessary'."]
    seeds: list[int | None] = [101, 102, None, 103, 104, None, 105, 106]
    requests = plan_requests(questions, seeds)
    loaded = await asyncio.to_thread(local.load_model, spec)
    alone = [(await complete_together(spec, [r], monkeypatch))[0] for r in requests]
    assert batching.queue.batch_sizes == {1: 1}
    prompts: list[tuple[int, ...]] = []
    hook = loaded.model.get_input_embeddings().register_forward_pre_hook(
        lambda _, args: prompts.append(tuple(args[0].shape)))
    try:
        batched = await complete_together(spec, requests, monkeypatch)
    finally:
        hook.remove()
    assert batching.queue.batch_sizes == {8: 1}, "seeded and unseeded plans share one batch"
    ids = [prompt_ids(loaded.tokenizer, r) for r in requests]
    width, shared = max(len(i) for i in ids), decode.shared_prefix(ids)
    role = len(loaded.tokenizer(BARE_ROLE)["input_ids"])
    assert shared > role, "the conductor's instructions open every plan prompt"
    assert prompts[:2] == [(1, shared), (8, width - shared)]
    compared = 0
    for seed, a, b in zip(seeds, alone, batched, strict=True):
        if seed is None:
            continue
        assert b.token_ids == a.token_ids, f"seed {seed}: {a.text!r} alone, {b.text!r} batched"
        assert (b.forced_positions, b.choice_tokens) == (a.forced_positions, a.choice_tokens)
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-5)
        compared += 1
    assert compared == 6
    assert len({tuple(c.token_ids or []) for c in alone}) > 4, "different seeds draw apart"


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
