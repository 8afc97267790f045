"""The plan grammar's records for rollouts a server sampled: reconstructed here, before the groups
become samples, so that a plan vLLM wrote trains exactly like one the local model wrote.

The local provider records forced steps and choice sets while it samples; a served conductor
(`openai-compatible`, vLLM) returns only token ids and log-probs, with the schema it was asked
to follow kept on the plan attempt (`PlanAttempt.json_schema`). The trainer walks that grammar
over the ids (engine/providers/local/reconstruct.py) because it is where the ids mean something: it
holds the tokenizer of the policy the server serves, torch and xgrammar are already loaded, and
the rollout path (the plan activity of an API conductor, which holds no model) stays free of
them.

A reconstructed attempt's server log-probs are dropped: vLLM's are over the whole vocabulary, the
trainer's over each choice set, and the choice set's share of the vocabulary is not in the
response. Its update takes the first step's own log-probs as behaviour log-probs, as TRL does
by default (docs/how-to/served-conductor.md measures the gap).

A run whose ids the grammar rejects was not sampled under this grammar (the server ignored or
did not receive the structured-output request): it is left out of its group as
"grammar_rejected", with the first rejected token as its detail, and the update logs one line
saying so.
"""

from __future__ import annotations

import threading
from typing import Any

import structlog

from conductor_engine.engine.contracts.records import PlanAttempt
from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.contracts.traces import Trace
from conductor_engine.engine.providers.local.reconstruct import Rejected, Vocabulary
from conductor_engine.engine.rewards.rollouts import Group, LeftOut

log = structlog.get_logger(__name__)

_vocabularies: dict[int, Vocabulary] = {}
_lock = threading.Lock()

FIX = ("serve the conductor with vLLM >= 0.10.2 and its xgrammar structured-output backend "
       "(the openai-compatible provider asks for it with `structured_outputs`); a local "
       "conductor needs xgrammar installed (docs/how-to/served-conductor.md)")


def vocabulary(model: Any, tokenizer: Any) -> Vocabulary:
    """The policy's vocabulary, built once per tokenizer (its grammar compiler caches)."""
    with _lock:
        vocab = _vocabularies.get(id(tokenizer))
        if vocab is None or vocab.tokenizer is not tokenizer:
            vocab = _vocabularies[id(tokenizer)] = Vocabulary.of(model, tokenizer)
        return vocab


def needs_reconstruction(attempt: PlanAttempt, *, unshape: bool = False) -> bool:
    """A served conductor's attempt: token ids and the schema, but no records of its own; with
    `unshape`, also an attempt whose shape or first agent was forced (`forced_shape`,
    `forced_agent`), whose records hold those decisions as forced or narrowed."""
    if attempt.token_ids is None or attempt.json_schema is None:
        return False
    forced = attempt.forced_shape is not None or attempt.forced_agent is not None
    return attempt.forced_positions is None or (unshape and forced)


def reconstruct_groups(groups: list[tuple[Group, int]], model: Any,
                  tokenizer: Any) -> list[tuple[Group, int]]:
    """The groups with every served attempt's records reconstructed, and the runs whose ids the
    grammar rejects moved to `left_out`; one warning line when there are any."""
    if not any(needs_reconstruction(a) for g, _ in groups for t in g.traces
               for r in t.rounds for a in r.attempts[-1:]):
        return groups
    vocab = vocabulary(model, tokenizer)
    out: list[tuple[Group, int]] = []
    rejected: list[str] = []
    for group, age in groups:
        kept: list[Trace] = []
        left = list(group.left_out)
        for trace in group.traces:
            rebuilt = reconstruct_trace(trace, vocab)
            if isinstance(rebuilt, str):
                left.append(LeftOut(workflow_id=trace.workflow_id, run_id=trace.run_id,
                                    reason="grammar_rejected", detail=rebuilt))
                rejected.append(f"{trace.workflow_id}: {rebuilt}")
            else:
                kept.append(rebuilt)
        out.append((revised(group, traces=kept, left_out=left), age))
    if rejected:
        runs = f"{len(rejected)} rollout{'s' if len(rejected) > 1 else ''}"
        log.warning(f"{runs} left out: the plan grammar rejects their token "
                    f"ids, so their backend did not sample under it (first: {rejected[0]}); "
                    f"{FIX}")
    return out


def reconstruct_trace(trace: Trace, vocab: Vocabulary, *, unshape: bool = False
                      ) -> Trace | str:
    """The trace with its deciding attempts' records reconstructed (their log-probs dropped), or
    why the grammar rejects one of them.

    `unshape` (the warm-up's): a plan written under a forced shape or first agent gets the
    plain grammar's records too, so the `,` that opened its second step, or the agent it was
    made to ask, is a choice to learn, not a forced token. The warm-up trains on the plan
    because it scored best, however it was sampled; left forced, a shape that only forcing ever
    wrote was never learned (its tokens out of the loss), and the warm-up's version went on
    writing one step."""
    rounds = []
    for rnd in trace.rounds:
        attempt = rnd.attempts[-1] if rnd.attempts else None
        if attempt is None or not needs_reconstruction(attempt, unshape=unshape):
            rounds.append(rnd)
            continue
        assert attempt.json_schema is not None and attempt.token_ids is not None
        records = vocab.reconstruct(attempt.json_schema, attempt.token_ids)
        if isinstance(records, Rejected):
            return f"round {rnd.index} plan attempt {attempt.attempt}: {records}"
        done = revised(attempt, forced_positions=records.forced_positions,
                       choice_tokens=records.choice_tokens,
                       logprobs=None)  # another space than the trainer's (served: the whole
        # vocabulary; shaped: the narrowed choices)
        rounds.append(revised(rnd, attempts=[*rnd.attempts[:-1], done]))
    return revised(trace, rounds=rounds)
