"""Forced tokens and choice sets are facts of the plan grammar and the token ids, not of who
sampled them (issue 33): walking the grammar over a local plan's ids gives back the records
the local sampler wrote; a plan served by vLLM under the same grammar becomes a Sample with
forced tokens and choices; a served plan whose ids break the grammar is left out of its group,
with its reason. Against the real local model (SmolLM2-135M-Instruct) and its tokenizer."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from typing import Any

import pytest
import structlog.testing

needs_local_extra = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None
        for m in ("torch", "transformers", "gguf", "xgrammar")),
    reason="the local extra is not installed (pip install -e '.[local]')",
)
pytestmark = needs_local_extra

from conductor_engine.engine.contracts.activities import PlanRequest  # noqa: E402
from conductor_engine.engine.contracts.records import PlanAttempt, RoundRecord  # noqa: E402
from conductor_engine.engine.contracts.tasks import RunOptions, Task  # noqa: E402
from conductor_engine.engine.contracts.training import RolloutConfig  # noqa: E402
from conductor_engine.engine.plan.language import plan_json_schema  # noqa: E402
from conductor_engine.engine.plan.prompts import conductor_messages  # noqa: E402
from conductor_engine.engine.providers.base import CompletionRequest  # noqa: E402
from conductor_engine.engine.providers.local.reconstruct import (  # noqa: E402
    Records,
    Rejected,
    Vocabulary,
)
from conductor_engine.engine.providers.pool import AgentSpec, Pool  # noqa: E402
from conductor_engine.engine.rewards.rollouts import Group  # noqa: E402
from tests.agent_server import AgentServer, Reply  # noqa: E402
from tests.traces import make_trace  # noqa: E402

AGENTS = [AgentSpec(id=name, provider="sim", model="sim", description=what)
          for name, what in (("alpha", "Solves maths."), ("bravo", "Checks answers."),
                             ("charlie", "Writes code."))]
QUESTION = "Add 17 and 25, then check the sum."


@pytest.fixture(scope="module")
def vocab(first_load: Any) -> Vocabulary:
    return Vocabulary.of(first_load.model, first_load.tokenizer)


def compact(value: Any) -> str:
    """JSON without the spaces the plan grammar writes after `,` and `:` (xgrammar's layout
    without free whitespace, which is json.dumps's)."""
    return json.dumps(value, separators=(",", ":"))


# ---------------------------------------------------------------------------------------------
# Local plans: the reconstruction gives back what the sampler recorded
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_reconstructed_records_equal_the_ones_the_local_sampler_recorded(
    first_load: Any, vocab: Vocabulary,
) -> None:
    """Real plans of the real conductor, reasoning-first and bare, sampled together as one
    batch: on every one, its reconstructed forced positions and choice sets are those recorded."""
    from conductor_engine.engine.providers import local

    spec = AgentSpec(id="smollm2", provider="local", model=local.SMOLLM2)
    ids = [a.id for a in AGENTS]
    schemas = [plan_json_schema(ids, 3, subtask_max_chars=120, reasoning_max_chars=160),
               plan_json_schema(ids, 3, subtask_max_chars=120)]
    requests = [
        CompletionRequest(
            messages=conductor_messages(QUESTION, AGENTS, max_steps=3, json_mode=True,
                                        reasoning_max_chars=160 if k % 2 == 0 else None),
            temperature=1.0, max_tokens=400, json_schema=schemas[k % 2], seed=k)
        for k in range(6)
    ]
    completions = await asyncio.gather(*(local.complete(spec, r) for r in requests))

    for request, done in zip(requests, completions, strict=True):
        assert request.json_schema is not None and done.token_ids is not None
        assert done.choice_tokens, f"no choice recorded in {done.text!r}"
        assert done.forced_positions is not None
        rebuilt = vocab.reconstruct(request.json_schema, done.token_ids)
        assert rebuilt == Records(done.forced_positions, done.choice_tokens), done.text


# ---------------------------------------------------------------------------------------------
# Served plans: from the scripted vLLM server to a Sample
# ---------------------------------------------------------------------------------------------


def served_pool(server: AgentServer) -> Pool:
    return Pool.model_validate({
        "conductor": {"id": "conductor", "provider": "openai-compatible", "model": "conductor",
                      "base_url": server.openai_base_url, "reasoning_max_chars": 300},
        "offer_conductor_as_agent": False,
        "agents": [a.model_dump() for a in AGENTS[:2]],
    })


PLAN = {"reasoning": "alpha adds, bravo checks.",
        "steps": [{"agent": "alpha", "subtask": "Add 17 and 25.", "access": []},
                  {"agent": "bravo", "subtask": "Check the sum and answer.", "access": "all"}]}


async def served_attempt(server: AgentServer, tokenizer: Any, ids: list[int]) -> PlanAttempt:
    """One plan attempt through the real plan activity, the conductor a vLLM the scripted
    server plays: it answers the plan's text with `ids` and a log-prob for each."""
    from temporalio.testing import ActivityEnvironment

    from conductor_engine.activities.plan import PlanActivities

    server.reset()
    logprobs = [-0.25 - k / 1000 for k in range(len(ids))]
    server.script("conductor", [Reply.ok(tokenizer.decode(ids, skip_special_tokens=True),
                                         token_ids=ids, logprobs=logprobs)])
    task = Task(question=QUESTION, options=RunOptions(max_steps=2, temperature=1.0))
    activities = PlanActivities(served_pool(server))
    attempt: PlanAttempt = await ActivityEnvironment().run(
        activities.write_plan, PlanRequest(task=task))
    return attempt


def as_group(*attempts: PlanAttempt) -> Group:
    traces = []
    for k, attempt in enumerate(attempts):
        trace = make_trace("t1", version="v0", reward=float(k % 2))
        rounds = [RoundRecord(index=0, attempts=[attempt], steps=trace.rounds[0].steps)]
        trace = trace.model_copy(update={"rounds": rounds})
        trace.task.options.temperature = 1.0
        traces.append(trace)
    return Group(task_id="t1", policy=traces[0].policy, traces=traces)


async def test_a_plan_served_by_vllm_becomes_a_sample_with_forced_tokens_and_choices(
    agent_server: AgentServer, first_load: Any, vocab: Vocabulary,
) -> None:
    from conductor_engine.trainer.reconstruct import reconstruct_groups
    from conductor_engine.trainer.rollouts import group_samples

    tokenizer = first_load.tokenizer
    ids = [*tokenizer(json.dumps(PLAN), add_special_tokens=False)["input_ids"], vocab.stop_ids[0]]
    attempt = await served_attempt(agent_server, tokenizer, ids)

    body = agent_server.requests("conductor")[0].body  # what vLLM was asked for
    schema = body["structured_outputs"]["json"]
    assert body["structured_outputs"]["disable_any_whitespace"] is True
    assert list(schema["properties"]) == ["reasoning", "steps"]
    assert "response_format" not in body  # one constraint: vLLM refuses two
    assert body["logprobs"] is True and body["return_token_ids"] is True
    assert attempt.plan is not None and len(attempt.plan) == 2
    assert attempt.token_ids == ids and attempt.logprobs is not None
    assert attempt.json_schema == schema and attempt.forced_positions is None

    other = attempt.model_copy(update={"token_ids": ids})  # a second rollout of the group
    [(group, _)] = reconstruct_groups([(as_group(attempt, other), 0)], first_load.model, tokenizer)
    assert not group.left_out
    samples = group_samples(group, 0, tokenizer, RolloutConfig(group_size=2), 1.0)
    assert len(samples) == 2
    sample = samples[0]
    assert sample.completion_ids == ids
    assert sample.forced is not None and sample.forced[0] and sample.forced[-1]
    # the agent of each step, its access: decisions over the grammar's few allowed tokens
    assert sample.choices and all(ids[k] in allowed for k, allowed in sample.choices.items())
    records = vocab.reconstruct(schema, ids)
    assert isinstance(records, Records)
    assert sorted(sample.choices) == sorted(records.choice_tokens)
    # full-vocabulary log-probs are not the trainer's space: recomputed
    # (docs/how-to/served-conductor.md)
    assert sample.behaviour_logprobs is None


async def test_a_served_plan_whose_ids_break_the_grammar_is_left_out_with_its_reason(
    agent_server: AgentServer, first_load: Any, vocab: Vocabulary,
) -> None:
    """A server that ignored the structured-output request writes JSON in another layout (here
    compact): valid JSON, a valid plan, but not this grammar's text, so the records would
    describe a distribution it was not sampled from."""
    from conductor_engine.trainer.reconstruct import reconstruct_groups
    from conductor_engine.trainer.rollouts import group_stats

    tokenizer = first_load.tokenizer
    good = [*tokenizer(json.dumps(PLAN), add_special_tokens=False)["input_ids"],
            vocab.stop_ids[0]]
    squeezed = [*tokenizer(compact(PLAN), add_special_tokens=False)["input_ids"],
                vocab.stop_ids[0]]
    broken = await served_attempt(agent_server, tokenizer, squeezed)
    assert broken.plan is not None  # the plan itself parses: only the grammar can tell
    fine = broken.model_copy(update={"token_ids": good})

    rejected = vocab.reconstruct(broken.json_schema or {}, squeezed)
    assert rejected == Rejected(3, squeezed[3], '":"')  # `{"reasoning` then `":"`, no space
    with structlog.testing.capture_logs() as logs:
        groups = reconstruct_groups([(as_group(fine, fine, broken), 0)], first_load.model,
                                    tokenizer)
    [line] = [e["event"] for e in logs if e["log_level"] == "warning"]  # one line, saying why
    assert line.startswith("1 rollout left out: the plan grammar rejects their token ids")
    assert str(rejected) in line and "structured_outputs" in line
    [(group, _)] = groups
    assert len(group.traces) == 2
    [out] = group.left_out
    assert out.reason == "grammar_rejected"
    assert out.detail == f"round 0 plan attempt 1: {rejected}"
    assert group_stats(groups).left_out == {"grammar_rejected": 1}


async def test_tokens_after_the_grammar_has_ended_are_rejected(vocab: Vocabulary) -> None:
    tokenizer = vocab.tokenizer
    schema = plan_json_schema(["alpha", "bravo"], 2, reasoning_max_chars=300)
    ids = [*tokenizer(json.dumps(PLAN), add_special_tokens=False)["input_ids"], vocab.stop_ids[0]]
    assert isinstance(vocab.reconstruct(schema, ids), Records)
    extra = vocab.reconstruct(schema, [*ids, ids[0]])
    assert extra == Rejected(len(ids), ids[0], tokenizer.decode([ids[0]]))
