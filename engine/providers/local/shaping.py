"""Forcing a plan's shape, or its first step's agent, while the rest of the plan is sampled.

A training rollout asked for a shape (`CompletionRequest.force_shape`, from the recipe's
`[rollouts] force_shapes`: engine/contracts/plan_shapes.py says what a shape is) is written under
its plan
grammar as usual, except at the choices where a token would decide the shape: there only the
tokens after which the plan can still take the asked shape stay allowed. One left: the token is
forced (written, recorded as forced, out of the loss, as the grammar's own forced text is).
Several (`"` and `[` both open an access list that can see an earlier step): the model chooses
among them, renormalised over them, and that narrowed set is recorded as the choice, so the
behaviour log-prob and the trainer's score are the same distribution: the importance ratio
stays exact for what was sampled.

A warm-up sample asked for an agent (`CompletionRequest.force_agent`, from the recipe's
`[warmup] force_agents`) is narrowed the same way at its first step's `agent` value: only the
tokens that keep the name written so far a prefix of the asked agent's stay allowed, so every
agent of the pool gets runs of every task, whatever the policy would pick.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from conductor_engine.engine.contracts.plan_shapes import Shape, consistent, parse_shape, shape_of


def consistent_tokens(text: str, allowed: list[int], token_text: Callable[[int], str],
                      target: Shape) -> list[int]:
    """The `allowed` tokens after which a plan written so far as `text` can still take the shape
    `target`: all of them where the next token decides nothing of the shape; `allowed` itself
    when none is (a grammar that cannot write the shape, fewer steps than it asks: the plan is
    then written as the model likes rather than stopped)."""
    now = shape_of(text)
    if not consistent(now, target):
        return allowed
    kept = [t for t in allowed if consistent(shape_of(text + token_text(t)), target)]
    return kept or allowed


# The first step's agent value opens at the first `"agent":` key of a plan's JSON. Under the plan
# grammar nothing earlier can match: inside a string a `"` is escaped, so `"agent"` followed by
# `:` is a key, and only step objects have an `agent` key.
_FIRST_AGENT = re.compile(r'"agent"\s*:\s*"')


def first_agent_consistent(text: str, agent: str) -> bool:
    """Whether a plan written so far as `text` can still name `agent` as its first step's
    agent: true before that value opens, then while what it holds is a prefix of the name, and
    after it closes when it is the name."""
    m = _FIRST_AGENT.search(text)
    if m is None:
        return True
    value = text[m.end():]
    close = value.find('"')
    return agent.startswith(value) if close < 0 else value[:close] == agent


def agent_tokens(text: str, allowed: list[int], token_text: Callable[[int], str],
                 agent: str) -> list[int]:
    """The `allowed` tokens after which the plan's first step can still be `agent`'s; `allowed`
    itself when none is (an agent the grammar does not offer: the plan is written as the model
    likes rather than stopped)."""
    if not first_agent_consistent(text, agent):
        return allowed
    kept = [t for t in allowed if first_agent_consistent(text + token_text(t), agent)]
    return kept or allowed


class Shaping:
    """Per row of a batch, the shape it is forced to and the agent its first step is forced to
    (None: not forced), and its text so far, fed one token at a time by grammar.GrammarMask."""

    def __init__(self, targets: list[Shape | None], token_text: Callable[[int], str],
                 agents: list[str | None] | None = None) -> None:
        self.targets = targets
        self.agents = agents or [None] * len(targets)
        self._text = token_text
        self._written: list[list[str]] = [[] for _ in targets]

    def __bool__(self) -> bool:
        return any(t is not None for t in self.targets) or any(self.agents)

    def _forced(self, row: int) -> bool:
        return self.targets[row] is not None or self.agents[row] is not None

    def feed(self, row: int, token: int) -> None:
        if self._forced(row):
            self._written[row].append(self._text(token))

    def narrow(self, row: int, allowed: list[int]) -> list[int]:
        """The tokens of `allowed` row `row` may take next (all of them for a row not forced)."""
        if not self._forced(row):
            return allowed
        text = "".join(self._written[row])
        target, agent = self.targets[row], self.agents[row]
        if target is not None:
            allowed = consistent_tokens(text, allowed, self._text, target)
        if agent is not None:
            allowed = agent_tokens(text, allowed, self._text, agent)
        return allowed


def forced_shapes(jobs: Sequence[Any], loaded: Any) -> Shaping | None:
    """The `Shaping` of a batch (its jobs' requests' `force_shape` and `force_agent`), or None
    when no row of it is forced."""
    targets = [parse_shape(j.request.force_shape) if j.request.force_shape else None
               for j in jobs]
    agents: list[str | None] = [j.request.force_agent for j in jobs]
    if not any(targets) and not any(agents):
        return None
    tokenizer = loaded.tokenizer
    return Shaping(targets, lambda token: str(tokenizer.decode([token])), agents)
