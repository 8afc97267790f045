"""The plan grammar walked over sampled token ids: the records GrammarMask writes while it
samples (forced steps, choice sets), derived afterwards from the ids alone.

Forced tokens and choice sets are facts of the grammar and of the tokens, not of who sampled
them, so a plan that a server (vLLM) sampled under the same grammar gets the records a local
plan gets and trains the same way (trainer/rollouts.py). The reconstruction walks a matcher
over the ids and, at each step, asks what GrammarMask asks before sampling:

- the grammar forces text there and the token is that text's own first token: forced (the
  local sampler writes exactly that token, so a local plan's records come back unchanged);
- otherwise, the grammar allows one token only: forced; a few (2 to CHOICE_MAX): a choice over
  them; more: free text.

A server that does not jump forward may write forced text in another split (`{` then `"`):
such a token is no longer forced text but one of the few the grammar allowed, so it is recorded
as what it was, a choice over them, or free text. A token the grammar does not allow at all, or
tokens after the grammar has ended, mean the server was not constrained by this grammar: the
reconstruction says where (`Rejected`), and the trainer leaves the run out.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from typing import Any

from conductor_engine.engine.providers.local.grammar import CHOICE_MAX


@dataclass(frozen=True)
class Records:
    """What the grammar decided along the ids: PlanAttempt.forced_positions and choice_tokens."""

    forced_positions: list[int]
    choice_tokens: dict[int, list[int]]


@dataclass(frozen=True)
class Rejected:
    """The first token the grammar did not allow, and where."""

    position: int
    token: int
    text: str

    def __str__(self) -> str:
        return f"token {self.token} ({self.text!r}) at position {self.position}"


@dataclass
class Vocabulary:
    """A model's vocabulary as the grammar sees it: the same three facts the local provider
    compiles its grammars with (grammar.grammar_compiler), so that both compile one grammar."""

    tokenizer: Any
    vocab_size: int
    stop_ids: list[int]
    _compiler: Any = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def of(cls, model: Any, tokenizer: Any) -> Vocabulary:
        """A transformers model's (or a peft model's) vocabulary, stopping where `generate`
        stops: the generation config's end tokens and the tokenizer's (as model._eos_ids
        reads them for the local provider: the two must agree, or the end of a plan would be
        a choice here and forced there)."""
        stops: list[int] = []
        configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        for value in (configured, tokenizer.eos_token_id):
            for i in value if isinstance(value, list) else [value]:
                if i is not None and int(i) not in stops:
                    stops.append(int(i))
        return cls(tokenizer, int(model.config.vocab_size), stops)

    def compile(self, schema: dict[str, Any]) -> Any:
        """The schema's grammar for this vocabulary, without free whitespace, as the local
        provider compiles it (grammar.compile_grammar); xgrammar caches compiled schemas."""
        import xgrammar as xgr

        with self._lock:
            if self._compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_ids)
                self._compiler = xgr.GrammarCompiler(info, max_threads=2)
        return self._compiler.compile_json_schema(schema, any_whitespace=False)

    @functools.cached_property
    def _first_token(self) -> Any:
        """Forced text -> its own first token, as the local sampler splits it."""
        encode = self.tokenizer

        @functools.lru_cache(maxsize=4096)
        def first(text: str) -> int | None:
            ids = encode(text, add_special_tokens=False)["input_ids"]
            return int(ids[0]) if ids else None

        return first

    def reconstruct(self, schema: dict[str, Any], token_ids: list[int]) -> Records | Rejected:
        """The grammar's records along `token_ids`, or where the grammar rejects them."""
        import torch
        import xgrammar as xgr

        matcher = xgr.GrammarMatcher(self.compile(schema))
        bitmask = xgr.allocate_token_bitmask(1, self.vocab_size)
        shifts = torch.arange(32, dtype=torch.int32)
        forced: list[int] = []
        choices: dict[int, list[int]] = {}
        for k, token in enumerate(token_ids):
            if matcher.is_terminated():  # the grammar had ended: nothing may follow
                return self._rejected(k, token)
            jump = matcher.find_jump_forward_string()
            matcher.fill_next_token_bitmask(bitmask, 0)
            words = bitmask[0]
            if not (0 <= token < self.vocab_size and (int(words[token // 32]) >> (token % 32)) & 1):
                return self._rejected(k, token)
            if jump and self._first_token(jump) == token:
                forced.append(k)
            elif int((words != 0).sum()) <= CHOICE_MAX:  # else more words set than a choice has
                few = ((words[:, None] >> shifts) & 1).flatten()[: self.vocab_size].nonzero()
                if few.shape[0] == 1:
                    forced.append(k)
                elif few.shape[0] <= CHOICE_MAX:
                    choices[k] = few[:, 0].tolist()
            if not matcher.accept_token(token):
                return self._rejected(k, token)
        return Records(forced, choices)

    def _rejected(self, k: int, token: int) -> Rejected:
        return Rejected(k, token, self.tokenizer.decode([token]))
