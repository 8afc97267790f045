"""Forcing a plan's shape (`[rollouts] force_shapes`, engine/providers/local/shaping.py): the
local sampler writes the asked shape, forces the tokens that decide it or narrows their choice,
samples the rest from the policy, and records behaviour log-probs the trainer reproduces.
Against a one-layer conductor with SmolLM2's tokenizer (tests/tiny_policy.py) and the real plan
grammar."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

needs_local_extra = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None
        for m in ("torch", "transformers", "gguf", "xgrammar")),
    reason="the local extra is not installed (pip install -e '.[local]')",
)

from conductor_engine.engine.contracts.agent_calls import Message  # noqa: E402
from conductor_engine.engine.contracts.plan_shapes import (  # noqa: E402
    consistent,
    forced_rollouts,
    forced_shape,
    shape_of,
    shapes,
)
from conductor_engine.engine.plan.language import plan_json_schema  # noqa: E402
from conductor_engine.engine.providers import local  # noqa: E402
from conductor_engine.engine.providers.base import CompletionRequest  # noqa: E402
from conductor_engine.engine.providers.local.reconstruct import Rejected  # noqa: E402
from conductor_engine.engine.providers.pool import AgentSpec  # noqa: E402

AGENTS = ["alpha", "bravo", "charlie", "delta"]


def _request(seed: int, shape: str | None) -> CompletionRequest:
    return CompletionRequest(
        messages=[Message(role="user", content="Plan: who should answer what is 2 + 2?")],
        temperature=1.0, max_tokens=120, seed=seed, force_shape=shape,
        json_schema=plan_json_schema(AGENTS, 3, subtask_max_chars=8))


def test_a_groups_last_rollouts_are_forced_to_each_shape_in_turn_at_an_annealed_share() -> None:
    """Half of 8 forced: the last 4, over the 3 shapes of two steps; the share falls linearly
    over the iterations asked, after which it is the full share again, as a rescue only."""
    assert forced_rollouts(0.5, None, 7, 8) == (4, False)
    assert [forced_rollouts(0.5, 4, i, 8) for i in range(6)] == [
        (4, False), (3, False), (2, False), (1, False), (4, True), (4, True)]
    assert [forced_shape(2, s, 8, 4) for s in range(8)] == [None] * 4 + [
        ("end",), ("more", "sees", "end"), ("more", "apart", "end"), ("end",)]


def test_a_warm_up_rounds_last_samples_are_forced_to_each_multi_step_shape_in_turn() -> None:
    """A quarter of 8 samples forced to each two-step shape: the last 4, sees and apart in
    turn (never one step: the policy writes that by itself); none where a plan has one step
    at most, and none when nothing is forced."""
    from conductor_engine.engine.contracts.plan_shapes import warmup_forced_shape
    from conductor_engine.engine.contracts.training import WarmupConfig

    forced = WarmupConfig(enabled=True, samples=8, force_shapes=0.5).forced_samples()
    assert forced == 4
    assert [warmup_forced_shape(2, s, 8, forced) for s in range(8)] == [None] * 4 + [
        ("more", "sees", "end"), ("more", "apart", "end")] * 2
    assert {warmup_forced_shape(1, s, 8, forced) for s in range(8)} == {None}
    assert {warmup_forced_shape(2, s, 8, 0) for s in range(8)} == {None}
    assert len({warmup_forced_shape(3, s, 6, 6) for s in range(6)}) == 6
    # dead_steps = "skip": no shape whose last step sees nothing (its earlier steps are dead)
    assert [warmup_forced_shape(2, s, 8, forced, live_only=True) for s in range(8)] == [
        None] * 4 + [("more", "sees", "end")] * 4
    assert {warmup_forced_shape(3, s, 6, 6, live_only=True) for s in range(6)} == {
        ("more", "sees", "end"), ("more", "sees", "more", "sees", "end"),
        ("more", "apart", "more", "sees", "end")}


@needs_local_extra
async def test_a_forced_rollout_writes_its_shape_and_samples_what_fills_it(
    tiny_policy_dir: Path,
) -> None:
    """Every shape of three steps, four seeds each: the plan has the shape; at each choice the
    recorded tokens can all still reach it (a narrowed choice is the choice); the agents inside
    vary; and an unforced request of the same seed is written as the policy likes."""
    spec = AgentSpec(id="tiny", provider="local", model=str(tiny_policy_dir))
    agents: Counter[str] = Counter()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_policy_dir))
    for shape in shapes(3):
        for seed in range(4):
            c = await local.complete(spec, _request(seed, ",".join(shape)))
            assert shape_of(c.text) == shape, (shape, c.text)
            plan = json.loads(c.text, strict=False)["steps"]
            agents.update(step["agent"] for step in plan)
            assert c.token_ids is not None
            texts = [str(tok.decode([t])) for t in c.token_ids]
            for k, allowed in (c.choice_tokens or {}).items():
                before = "".join(texts[:k])
                for t in allowed:  # every token the choice was drawn from reaches the shape
                    assert consistent(shape_of(before + str(tok.decode([t]))), shape)
    assert len(agents) >= 3, agents  # the agents are sampled, not forced
    free = [shape_of((await local.complete(spec, _request(s, None))).text) for s in range(4)]
    assert all(free), free


def _assert_scored_as_sampled(model: Any, tok: Any, request: CompletionRequest,
                              c: Any) -> set[int]:
    """Every token in the loss has the behaviour log-prob the trainer scores (the importance
    ratio exact for what was sampled); returns the forced positions, which are out of it."""
    import torch

    from conductor_engine.engine.providers.local.chat import prompt_ids
    from conductor_engine.trainer.grpo import Sample, collate, per_token_logprobs

    assert c.token_ids is not None and c.logprobs is not None
    forced = set(c.forced_positions or ())
    sample = Sample(prompt_ids=prompt_ids(tok, request), completion_ids=c.token_ids,
                    advantage=1.0, forced=[k in forced for k in range(len(c.token_ids))],
                    choices=c.choice_tokens or None)
    with torch.no_grad():
        scored = per_token_logprobs(model, collate([sample], tok.pad_token_id))[0]
    for k in range(len(c.token_ids)):
        if k not in forced:
            assert scored[k].item() == pytest.approx(c.logprobs[k], abs=1e-4), k
    return forced


@needs_local_extra
async def test_a_forced_rollouts_log_probs_are_what_the_trainer_scores(
    tiny_policy_dir: Path,
) -> None:
    """The behaviour log-prob of every token in the loss (sampled, or chosen among a narrowed
    set) equals the trainer's score of it, and the tokens the shape forced are out of the loss:
    the importance ratio of a forced rollout is 1 on-policy."""
    from transformers import AutoModelForCausalLM, AutoTokenizer


    spec = AgentSpec(id="tiny", provider="local", model=str(tiny_policy_dir))
    tok = AutoTokenizer.from_pretrained(str(tiny_policy_dir))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_policy_dir)).float()
    narrowed = 0
    for s, shape in enumerate(shapes(2)):
        request = _request(s, ",".join(shape))
        c = await local.complete(spec, request)
        forced = _assert_scored_as_sampled(model, tok, request, c)
        decided_by_shape = [k for k, t in enumerate(c.token_ids)
                            if str(tok.decode([t]))[:1] in ",]" and k in forced]
        assert decided_by_shape, c.text  # the `,` / `]` after the first step was forced
        for a in (c.choice_tokens or {}).values():  # an access that must see: no `[]`
            texts = [str(tok.decode([t])) for t in a]
            narrowed += all(t[:1] in '"[' for t in texts) and '"' in "".join(texts) \
                and not any(t.startswith("[]") for t in texts)
    assert narrowed, "no narrowed access choice was drawn: the test checks nothing there"


@needs_local_extra
async def test_a_warm_up_learns_the_shape_a_forced_sample_was_written_in(
    tiny_policy_dir: Path,
) -> None:
    """A forced sample's records hold the shape's `,` as forced: right for GRPO's importance
    weights, but a warm-up that trained on them never learned the shape (its tokens out of the
    loss), and its version went on writing one step. Rebuilt with `unshape`, the records are the
    plain grammar's: the `,` is a choice in the loss; without it the attempt stays as recorded."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from conductor_engine.engine.contracts.records import PlanAttempt
    from conductor_engine.engine.contracts.strict import revised
    from conductor_engine.engine.contracts.training import WarmupConfig
    from conductor_engine.engine.providers.local.reconstruct import Vocabulary
    from conductor_engine.trainer.reconstruct import needs_reconstruction, reconstruct_trace
    from conductor_engine.trainer.warmup import warmup_samples
    from tests.traces import make_trace

    spec = AgentSpec(id="tiny", provider="local", model=str(tiny_policy_dir))
    tok = AutoTokenizer.from_pretrained(str(tiny_policy_dir))
    vocab = Vocabulary.of(AutoModelForCausalLM.from_pretrained(str(tiny_policy_dir)), tok)
    request = _request(0, "more,sees,end")
    c = await local.complete(spec, request)
    assert c.token_ids is not None and request.json_schema is not None
    attempt = PlanAttempt(attempt=1, raw_text=c.text, prompt=request.messages,
                          token_ids=c.token_ids, logprobs=c.logprobs,
                          forced_positions=c.forced_positions, choice_tokens=c.choice_tokens,
                          json_schema=request.json_schema, forced_shape=request.force_shape)
    trace = make_trace("t1")
    trace = revised(trace, rounds=[revised(trace.rounds[0], attempts=[attempt])])
    comma = next(k for k, t in enumerate(c.token_ids)
                 if str(tok.decode([t])).startswith(",") and k in (c.forced_positions or ()))

    assert not needs_reconstruction(attempt) and needs_reconstruction(attempt, unshape=True)
    assert reconstruct_trace(trace, vocab) == trace  # GRPO's: as the sampler recorded it
    rebuilt = reconstruct_trace(trace, vocab, unshape=True)
    assert not isinstance(rebuilt, str)
    learnt = rebuilt.rounds[0].attempts[-1]
    plain = vocab.reconstruct(request.json_schema, c.token_ids)
    assert not isinstance(plain, Rejected)
    assert (learnt.forced_positions, learnt.choice_tokens) == (plain.forced_positions,
                                                               plain.choice_tokens)
    assert comma not in learnt.forced_positions and len(learnt.choice_tokens[comma]) >= 2
    [sample] = warmup_samples([rebuilt], tok, WarmupConfig())
    assert sample.forced is not None and not sample.forced[comma]
    [as_recorded] = warmup_samples([trace], tok, WarmupConfig())
    assert as_recorded.forced is not None and as_recorded.forced[comma]


def test_a_warm_up_rounds_samples_before_the_shape_forced_ask_each_agent_in_turn() -> None:
    """Half of 16 samples forced to an agent and a quarter to a shape: samples 4..11 ask each
    agent of the task's pool twice, in the pool's order; the first 4 and the shape-forced last
    4 are not forced to an agent; nothing is forced without a share or a pool; and shares
    summing past the whole are refused."""
    from conductor_engine.engine.contracts.training import WarmupConfig

    cfg = WarmupConfig(enabled=True, samples=16, force_agents=0.5, force_shapes=0.25)
    assert [cfg.forced_agent(AGENTS, s) for s in range(16)] == [None] * 4 + AGENTS * 2 + [
        None] * 4
    assert {WarmupConfig(enabled=True, samples=16).forced_agent(AGENTS, s)
            for s in range(16)} == {None}
    assert {cfg.forced_agent([], s) for s in range(16)} == {None}
    with pytest.raises(ValueError, match="together at most 1"):
        WarmupConfig(enabled=True, samples=8, force_agents=0.75, force_shapes=0.5)


def test_a_first_agent_is_consistent_while_its_name_can_still_be_written() -> None:
    """Before the first step's `agent` value opens anything goes; inside it, a prefix of the
    name (so `s` for `sierra` where `scarlet` shares it); closed, the name and nothing else.
    An `"agent":` inside the reasoning's text is escaped and does not count, nor does the
    second step's agent."""
    from conductor_engine.engine.providers.local.shaping import first_agent_consistent

    assert first_agent_consistent('{"steps": [{"ag', "sierra")
    assert first_agent_consistent('{"steps": [{"agent": "', "sierra")
    assert first_agent_consistent('{"steps": [{"agent": "s', "sierra")
    assert not first_agent_consistent('{"steps": [{"agent": "sc', "sierra")
    assert first_agent_consistent('{"steps": [{"agent": "sierra"', "sierra")
    assert not first_agent_consistent('{"steps": [{"agent": "sierra"', "sier")
    assert not first_agent_consistent('{"steps":[{"agent":"sierra2"', "sierra")
    reasoning = '{"reasoning": "ask \\"agent\\": \\"onyx\\"", "steps": [{"agent": "si'
    assert first_agent_consistent(reasoning, "sierra")
    assert not first_agent_consistent(reasoning, "onyx")
    second = '{"steps": [{"agent": "sierra", "subtask": "do it all", "access": []}, {"agent": "o'
    assert first_agent_consistent(second, "sierra")


def _agent_request(seed: int, agent: str | None) -> CompletionRequest:
    return CompletionRequest(
        messages=[Message(role="user", content="Plan: who should answer what is 2 + 2?")],
        temperature=1.0, max_tokens=120, seed=seed, force_agent=agent, explore=0.5,
        json_schema=plan_json_schema(AGENTS, 2, subtask_max_chars=8))


@needs_local_extra
async def test_a_sample_forced_to_an_agent_asks_it_first_and_is_scored_as_sampled(
    tiny_policy_dir: Path,
) -> None:
    """Each agent forced, three seeds each, exploring: the first step asks it; the plan's
    length and later agents are still sampled; every token in the loss has the behaviour
    log-prob the trainer scores (the importance ratio exact for what was sampled); and the
    warm-up's `unshape` rebuild makes the forced name a choice it learns."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from conductor_engine.engine.contracts.records import PlanAttempt
    from conductor_engine.engine.contracts.strict import revised
    from conductor_engine.engine.providers.local.reconstruct import Vocabulary
    from conductor_engine.trainer.reconstruct import needs_reconstruction, reconstruct_trace
    from tests.traces import make_trace

    spec = AgentSpec(id="tiny", provider="local", model=str(tiny_policy_dir))
    tok = AutoTokenizer.from_pretrained(str(tiny_policy_dir))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_policy_dir)).float()
    vocab = Vocabulary.of(model, tok)
    others = 0  # later steps asking another agent than the forced one
    for agent in AGENTS:
        for seed in range(3):
            request = _agent_request(seed, agent)
            c = await local.complete(spec, request)
            steps = json.loads(c.text, strict=False)["steps"]
            assert steps[0]["agent"] == agent, (agent, c.text)
            others += sum(s["agent"] != agent for s in steps[1:])
            _assert_scored_as_sampled(model, tok, request, c)
            assert c.token_ids is not None and c.logprobs is not None
            attempt = PlanAttempt(attempt=1, raw_text=c.text, prompt=request.messages,
                                  token_ids=c.token_ids, logprobs=c.logprobs,
                                  forced_positions=c.forced_positions,
                                  choice_tokens=c.choice_tokens,
                                  json_schema=request.json_schema, forced_agent=agent)
            assert needs_reconstruction(attempt, unshape=True)
            assert not needs_reconstruction(attempt)
            trace = make_trace("t1")
            trace = revised(trace, rounds=[revised(trace.rounds[0], attempts=[attempt])])
            rebuilt = reconstruct_trace(trace, vocab, unshape=True)
            assert not isinstance(rebuilt, str)
            learnt = rebuilt.rounds[0].attempts[-1]
            texts = [str(tok.decode([t])) for t in c.token_ids]
            name = next(k for k in range(len(texts))
                        if '"agent"' in "".join(texts[:k]) and texts[k].strip(' "'))
            assert name not in learnt.forced_positions, (agent, texts[name])
            assert len(learnt.choice_tokens[name]) >= 2  # the name is a choice among agents
    assert others, "no later step asked another agent: the test checks nothing there"
