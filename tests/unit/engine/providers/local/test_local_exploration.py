"""Exploring rollouts (`[rollouts] explore`, engine/providers/local/grammar.py): each decision of
a constrained plan (a choice right after forced text) is drawn uniformly over the tokens the
grammar allows there with probability epsilon, from the row's own seeded generator, and its
behaviour log-prob is the policy's, or the mixture's with `explore_importance`. Against a
one-layer conductor with SmolLM2's tokenizer (tests/tiny_policy.py) and the real plan grammar."""

from __future__ import annotations

import importlib.util
import json
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

needs_local_extra = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None
        for m in ("torch", "transformers", "gguf", "xgrammar")),
    reason="the local extra is not installed (pip install -e '.[local]')",
)

from conductor_engine.engine.contracts.agent_calls import Message  # noqa: E402
from conductor_engine.engine.plan.language import plan_json_schema  # noqa: E402
from conductor_engine.engine.providers import local  # noqa: E402
from conductor_engine.engine.providers.base import Completion, CompletionRequest  # noqa: E402
from conductor_engine.engine.providers.local.grammar import outcomes  # noqa: E402
from conductor_engine.engine.providers.local.sampling import sampled_logprobs  # noqa: E402
from conductor_engine.engine.providers.pool import AgentSpec  # noqa: E402

AGENTS = ["alpha", "bravo", "charlie", "delta"]


def test_an_exploring_decision_s_log_prob_is_the_mixture_s() -> None:
    """mu(t) = (1 - eps) p_C(t) + eps q(t) at a decision, q the exploring draw's distribution;
    the policy's own elsewhere, and at every step of a row that does not explore."""
    import torch

    logits = tuple(torch.tensor([[2.0, 0.0, -1.0, 5.0], [2.0, 0.0, -1.0, 5.0]])
                   for _ in range(2))
    tokens = torch.tensor([[1, 3], [1, 3]])
    choices = [{0: [0, 1, 2]}, {0: [0, 1, 2]}]
    q = {0: 0.5, 1: 0.25, 2: 0.25}  # token 0 one option, tokens 1 and 2 spell the other
    plain = sampled_logprobs(logits, tokens, 1.0, choices)
    mixed = sampled_logprobs(logits, tokens, 1.0, choices, [0.5, 0.0], [{0: q}, {0: q}])
    p_c = math.exp(0.0) / (math.exp(2.0) + math.exp(0.0) + math.exp(-1.0))
    assert plain[0, 0].item() == pytest.approx(math.log(p_c), abs=1e-6)
    assert mixed[0, 0].item() == pytest.approx(math.log(0.5 * p_c + 0.5 * 0.25), abs=1e-6)
    assert mixed[0, 1].item() == plain[0, 1].item()  # not a decision
    assert mixed[1].tolist() == plain[1].tolist()  # a row that does not explore


def test_a_decision_s_options_are_its_tokens_grouped_by_first_character() -> None:
    """`vale` spelled three ways and `fjord` one way are one option each; so are the plan's
    end (`]`, `]}`) and another step (`,`)."""
    text = {1: "d", 2: "f", 3: "j", 4: "v", 5: "du", 6: "val", 7: "va", 8: "ju", 9: "jun",
            10: ",", 11: "]", 12: "]}"}.__getitem__
    assert outcomes([1, 2, 3, 4, 5, 6, 7, 8, 9], text) == [[1, 5], [2], [3, 8, 9], [4, 6, 7]]
    assert outcomes([10, 11, 12], text) == [[10], [11, 12]]


def _request(seed: int, explore: float, importance: bool = False,
             temperature: float = 1.0) -> CompletionRequest:
    return CompletionRequest(
        messages=[Message(role="user", content="Plan: who should answer what is 2 + 2?")],
        temperature=temperature, max_tokens=100, seed=seed, explore=explore,
        explore_importance=importance,
        json_schema=plan_json_schema(AGENTS, 3, subtask_max_chars=8))


def _decisions(c: Completion, decode: Callable[[int], str] | None = None) -> list[int]:
    """A completion's decisions: its choices right after a forced token (or first), and those
    right after a decision with two options or more (`decode` groups a choice's tokens into
    options; without it, only the first kind is found)."""
    forced = set(c.forced_positions or ())
    found: list[int] = []
    for k, allowed in sorted((c.choice_tokens or {}).items()):
        after_decision = decode is not None and k - 1 in found \
            and len(outcomes(allowed, decode)) > 1
        if k == 0 or k - 1 in forced or after_decision:
            found.append(k)
    return found


async def _complete(spec: AgentSpec, requests: list[CompletionRequest]) -> list[Completion]:
    return [await local.complete(spec, r) for r in requests]


@needs_local_extra
async def test_exploring_draws_each_decision_uniformly_at_its_rate_and_reproducibly(
    tiny_policy_dir: Path,
) -> None:
    """At explore 0.99 nearly every decision is uniform over its options: the first step's
    agent spreads over the four agents, the plans take every length, the same seed draws
    the same plan again, and the draws are the seed's, not the model's: sampled at another
    temperature, the same seeds make the same first decisions."""
    spec = AgentSpec(id="tiny", provider="local", model=str(tiny_policy_dir))
    seeds = range(24)
    explored = await _complete(spec, [_request(s, 0.99) for s in seeds])
    cold = await _complete(spec, [_request(s, 0.99, temperature=0.3) for s in seeds])

    def first_agent_tokens(cs: list[Completion]) -> Counter[int]:
        out: Counter[int] = Counter()
        for c in cs:
            assert c.token_ids is not None
            out[c.token_ids[_decisions(c)[0]]] += 1
        return out

    allowed = (explored[0].choice_tokens or {})[_decisions(explored[0])[0]]
    assert set(first_agent_tokens(explored)) <= set(allowed)
    agents = Counter(json.loads(c.text, strict=False)["steps"][0]["agent"] for c in explored)
    assert set(agents) == set(AGENTS), agents  # 24 draws over 4 options: each seen ...
    assert max(agents.values()) <= 12, agents  # ... and none takes half

    def first(c: Completion) -> int:
        assert c.token_ids is not None
        return c.token_ids[_decisions(c)[0]]

    assert sum(first(a) == first(b) for a, b in zip(explored, cold, strict=True)) >= 21
    lengths = Counter(c.text.count('"agent"') for c in explored)
    assert set(lengths) == {1, 2, 3}, lengths  # `,` (one more step) tried as often as `]`
    again = await _complete(spec, [_request(s, 0.99) for s in seeds[:5]])
    assert [c.token_ids for c in again] == [c.token_ids for c in explored[:5]]


@needs_local_extra
async def test_explore_importance_records_the_mixture_s_log_probs_at_decisions_only(
    tiny_policy_dir: Path,
) -> None:
    """The same seeds draw the same tokens with and without `explore_importance`; only the
    log-probs at decisions differ, by exactly the mixture."""
    spec = AgentSpec(id="tiny", provider="local", model=str(tiny_policy_dir))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_policy_dir))

    def decode(token: int) -> str:
        return str(tokenizer.decode([token]))

    eps = 0.5
    inner = 0
    for seed in range(6):
        policy, = await _complete(spec, [_request(seed, eps)])
        mixture, = await _complete(spec, [_request(seed, eps, importance=True)])
        assert policy.token_ids == mixture.token_ids
        assert policy.logprobs is not None and mixture.logprobs is not None
        decisions = set(_decisions(policy, decode))
        assert decisions
        inner += len(decisions - set(_decisions(policy)))  # an access list's `0` or `]`
        for k, (lp, lm) in enumerate(zip(policy.logprobs, mixture.logprobs, strict=True)):
            if k in decisions:
                groups = outcomes((policy.choice_tokens or {})[k], decode)
                q = next(1 / (len(groups) * len(g)) for g in groups if policy.token_ids[k] in g)
                assert lm == pytest.approx(math.log((1 - eps) * math.exp(lp) + eps * q),
                                           abs=1e-5)
            else:
                assert lm == lp
    assert inner, "no decision inside an access list was drawn: the test checks nothing there"


@needs_local_extra
def test_an_exploring_draw_takes_each_option_alike_however_many_tokens_spell_it() -> None:
    """Uniform over options, then tokens: `vale` (three tokens) no likelier than `fjord` (one),
    and the plan's end (`]`, `]}`) no likelier than another step (`,`)."""
    from conductor_engine.engine.providers.local.grammar import GrammarMask

    mask = GrammarMask([None], 16, _OneRow(), lambda text: [], explore=[1.0], seeds=[7])
    draws = Counter(mask._explored_token(0, [[1, 5], [2], [3, 8, 9], [4, 6, 7]])
                    for _ in range(4000))
    by_option = Counter({"d": draws[1] + draws[5], "f": draws[2],
                         "j": draws[3] + draws[8] + draws[9], "v": draws[4] + draws[6] + draws[7]})
    assert all(900 <= n <= 1100 for n in by_option.values()), by_option
    assert all(250 <= draws[t] <= 420 for t in (3, 8, 9, 4, 6, 7)), draws  # a third of 1000
    ends = Counter(mask._explored_token(0, [[10], [11, 12]]) for _ in range(4000))
    assert 1900 <= ends[10] <= 2100, ends


class _OneRow:
    finished = [False]
