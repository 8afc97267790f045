"""Forcing a plan's shape while the agents, subtasks and access inside it are sampled.

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
"""

from __future__ import annotations

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


class Shaping:
    """Per row of a batch, the shape it is forced to (None: not forced) and its text so far,
    fed one token at a time by grammar.GrammarMask."""

    def __init__(self, targets: list[Shape | None], token_text: Callable[[int], str]) -> None:
        self.targets = targets
        self._text = token_text
        self._written: list[list[str]] = [[] for _ in targets]

    def __bool__(self) -> bool:
        return any(t is not None for t in self.targets)

    def feed(self, row: int, token: int) -> None:
        if self.targets[row] is not None:
            self._written[row].append(self._text(token))

    def narrow(self, row: int, allowed: list[int]) -> list[int]:
        """The tokens of `allowed` row `row` may take next (all of them for a row not forced)."""
        target = self.targets[row]
        if target is None:
            return allowed
        return consistent_tokens("".join(self._written[row]), allowed, self._text, target)


def forced_shapes(jobs: Sequence[Any], loaded: Any) -> Shaping | None:
    """The `Shaping` of a batch (its jobs' requests' `force_shape`), or None when no row of it
    is forced."""
    targets = [parse_shape(j.request.force_shape) if j.request.force_shape else None
               for j in jobs]
    if not any(targets):
        return None
    tokenizer = loaded.tokenizer
    return Shaping(targets, lambda token: str(tokenizer.decode([token])))
