"""Structured output for the local model: a request's JSON schema, enforced with xgrammar.

The schema is compiled once per model vocabulary, and a logits processor keeps each row of a
batch inside its own grammar, writing the text the grammar forces in the tokenizer's own split.
xgrammar is optional: without it a request is generated unconstrained, with a warning.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import threading
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from conductor_engine.engine.providers.base import AgentCallError, CompletionRequest
from conductor_engine.engine.providers.local.errors import BAD_REQUEST, INSTALL_HINT
from conductor_engine.engine.providers.local.model import LoadedModel
from conductor_engine.engine.providers.local.shaping import Shaping
from conductor_engine.engine.providers.pool import AgentSpec

log = structlog.get_logger(__name__)

_compiler_lock = threading.Lock()

_gpu_backend: Any = "auto"  # xgrammar's choice (Triton) until it fails once: see _apply_bitmask

CHOICE_MAX = 256
"""A step whose grammar allows at most this many tokens is a choice (see GrammarMask)."""


class Rows(Protocol):
    """Which rows of the batch are finished (batching.Rows, the batch's stopping criterion)."""

    finished: list[bool]


def compile_grammar(spec: AgentSpec, loaded: LoadedModel, request: CompletionRequest) -> Any:
    """The request's JSON schema compiled for this model's vocabulary, or None (with a warning)
    when xgrammar is not installed."""
    if importlib.util.find_spec("xgrammar") is None:
        log.warning(
            "xgrammar is not installed; generating without the JSON schema constraint",
            agent=spec.id,
            fix=INSTALL_HINT,
        )
        return None
    compiler = grammar_compiler(loaded)
    try:
        # Compact JSON (no free whitespace): fewer tokens, and no way to stall in blank space.
        return compiler.compile_json_schema(request.json_schema, any_whitespace=False)
    except Exception as e:
        raise AgentCallError(
            f"agent {spec.id}: xgrammar cannot compile the {request.schema_name!r} JSON schema: "
            f"{e}; fix the schema or turn structured_output off for this agent",
            retryable=False,
            kind=BAD_REQUEST,
        ) from e


def grammar_compiler(loaded: LoadedModel) -> Any:
    """One xgrammar compiler per model (it caches compiled schemas), built on first use.

    Its stop tokens are the ones `generate` stops on, so a finished JSON value can only be
    followed by end-of-turn and generation ends right after the closing brace.
    """
    import xgrammar as xgr

    with _compiler_lock:
        if loaded.xgrammar_compiler is None:
            info = xgr.TokenizerInfo.from_huggingface(
                loaded.tokenizer, vocab_size=loaded.vocab_size, stop_token_ids=loaded.eos_ids
            )
            loaded.xgrammar_compiler = xgr.GrammarCompiler(info, max_threads=2)
        return loaded.xgrammar_compiler


def explore_generators(seeds: list[int | None]) -> list[Any]:
    """A CPU generator per seeded row for its exploration draws, apart from the sampler's
    (sampling.row_generators), so that exploring leaves the sampler's stream as it was; None
    for a row without a seed (torch's global generator).

    Seeded with a hash of the row's seed: Mersenne Twister's first draws for nearby seeds
    (a group's rollouts 0, 1, 2, ...) are correlated, and a uniform pick over 15 tokens took
    the same token for 7 of 24 consecutive seeds."""
    import torch

    def hashed(seed: int) -> int:
        digest = hashlib.blake2b(f"explore:{seed}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") >> 1

    return [None if s is None else torch.Generator().manual_seed(hashed(s)) for s in seeds]


def text_encoder(loaded: LoadedModel) -> Callable[[str], list[int]]:
    """Text to token ids the way the model's tokenizer splits it, with no special tokens."""
    tokenizer = loaded.tokenizer
    return lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])


def token_decoder(loaded: LoadedModel) -> Callable[[int], str]:
    """A token id's text."""
    tokenizer = loaded.tokenizer
    return lambda token: str(tokenizer.decode([token]))


def outcomes(allowed: list[int], text: Callable[[int], str]) -> list[list[int]]:
    """A decision's allowed tokens grouped by what they decide: by their text's first character.

    A decision's options are spelled by unequal numbers of tokens: an agent `vale` by `v`,
    `va` and `val`, `fjord` by `f` alone; the end of a plan by `]` and `]}`, another step by
    `,` only. Uniform over tokens, exploring tried `vale` three times as often as `fjord` and
    ended the plan two times in three; uniform over these groups it tries each option alike.
    In a plan's JSON, options that begin with the same character (two agents `sierra` and
    `scarlet`) share a group: the explored first letter is theirs, the model picks between them.
    """
    groups: dict[str, list[int]] = {}
    for token in allowed:
        groups.setdefault(text(token)[:1], []).append(token)
    return list(groups.values())


class GrammarMask:
    """A logits processor (duck-typed, see batching.Rows) that keeps each row of a batch inside
    its own grammar; a row without one (no json_schema) is left alone.

    Before each token it feeds every unfinished row's matcher the token that row sampled last,
    and masks what that row's grammar does not allow next. Written here rather than taken from
    xgrammar.contrib.hf because that one asserts on a rejected token, moves the logits between
    devices, and knows nothing of rows that have finished.

    Where the grammar leaves a small set of tokens to choose from (at most `CHOICE_MAX`: which
    agent, which access, one more step or not), it records the set (`choices`, per row: step ->
    allowed ids). Those are the plan's decisions, and the model that sampled them is the model
    under the grammar: its probability of a choice is renormalised over the set, which is how
    the behaviour log-probabilities and the trainer score them (sampling.sampled_logprobs,
    trainer/grpo/_logprobs.py). Over the whole vocabulary a right choice may carry e^-15 and its
    importance ratio swing by orders of magnitude while the choice itself barely moves.

    Where the grammar forces the text that comes next (the JSON keys and brackets around the
    choices), the row gets that text's own tokenization, one token at a time, instead of sampling
    one of the many token splits the grammar would accept (`{"` or `{` then `"`, `ch` `arl` `ie`
    or `c` `h` ...). Every plan of a task then reaches each of its choices through the same
    tokens: the choice is made in the same context in every rollout of a group, which is what
    lets GRPO credit it, and a model reads the structure as it was trained to read it.

    A row asked to explore (`explore[r]` = epsilon > 0, a training rollout's
    `CompletionRequest.explore`) makes each of its decisions (a choice right after forced text:
    the first token of an agent's name, of an access list, the `,` that adds a step or the `]`
    that ends the plan) with probability epsilon uniformly over its options (`outcomes`: one of
    the option groups, then one of its tokens), and otherwise as its model would: the draw is
    from its own generator, seeded from the row's seed, so a rollout stays reproducible. Each
    decision's exploring distribution is kept (`decisions`: step -> token -> q(token)); the
    behaviour log-probs there are the policy's, or the mixture's for an `explore_importance`
    request (sampling.sampled_logprobs), whose importance ratio then corrects for exploring.

    A row forced to a plan shape (`shaping`, engine/providers/local/shaping.py) has its choices
    narrowed to the tokens that can still reach the shape: one left is forced, several are the
    choice (recorded as such, so its log-probs are over them).
    """

    def __init__(self, grammars: list[Any], vocab_size: int, rows: Rows,
                 encode: Callable[[str], list[int]], explore: list[float] | None = None,
                 seeds: list[int | None] | None = None,
                 decode: Callable[[int], str] | None = None,
                 shaping: Shaping | None = None) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self._matchers: list[Any] = [None if g is None else xgr.GrammarMatcher(g)
                                     for g in grammars]
        self._bitmask = xgr.allocate_token_bitmask(len(grammars), vocab_size)
        self._vocab_size = vocab_size
        self._rows = rows
        self._started = False
        self._batch_matcher: Any = None  # xgrammar's BatchGrammarMatcher, on a GPU only
        self._step = 0  # the index of the token each unfinished row generates next
        self.forced: list[list[int]] = [[] for _ in grammars]  # per row: steps it was forced
        self.choices: list[dict[int, list[int]]] = [{} for _ in grammars]  # per row: see above
        self._bits: Any = None  # [32] int32 shifts, for unpacking the bitmask
        self._encode = functools.lru_cache(maxsize=4096)(lambda text: tuple(encode(text)))
        self.explore = explore or [0.0] * len(grammars)
        # per row: explorable step -> allowed token -> its probability when the row explores
        self.decisions: list[dict[int, dict[int, float]]] = [{} for _ in grammars]
        self._text = functools.lru_cache(maxsize=65536)(decode or (lambda token: str(token)))
        self._explore_generators = explore_generators(
            seeds or [None] * len(grammars)) if any(self.explore) else [None] * len(grammars)
        self.shaping = shaping if shaping else None  # rows whose plan shape is forced

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        forcing = []
        last = input_ids[:, -1].tolist() if self._started else []  # one read, not one per row
        masked = [r for r, m in enumerate(self._matchers)
                  if m is not None and not self._rows.finished[r]]
        if scores.device.type == "cuda" and len(masked) > 1:
            self._accept_and_fill_batch(masked, last)
        else:
            self._accept_and_fill(masked, last)
        exploring, narrowing = [], []
        if self.shaping is not None and self._started:
            for r in masked:
                self.shaping.feed(r, int(last[r]))
        for r in masked:
            forced = self._forced_token(self._matchers[r], r)
            if forced is not None:
                forcing.append((r, forced))
                continue
            allowed = self._record_choice(r)
            if allowed is not None and self.shaping is not None:
                kept = self.shaping.narrow(r, allowed)
                if len(kept) == 1:  # the shape decides this token: forced, out of the loss
                    del self.choices[r][self._step]
                    forcing.append((r, kept[0]))
                    continue
                if len(kept) < len(allowed):  # the model chooses among these only
                    self.choices[r][self._step] = allowed = kept
                    narrowing.append((r, kept))
            if allowed is None or not self.explore[r]:
                continue
            groups = outcomes(allowed, self._text)
            if self._is_decision(r, groups):
                self.decisions[r][self._step] = {
                    t: 1.0 / (len(groups) * len(g)) for g in groups for t in g}
                token = self._explored_token(r, groups)
                if token is not None:
                    exploring.append((r, token))
        self._started = True
        # a copy: `generate` keeps the tensor it passes here as the step's raw logits, which
        # the behaviour logprobs are computed from (renormalised over `choices` where recorded)
        scores = scores.clone()
        if masked:
            self._apply_bitmask(scores, masked)
        for r, kept in narrowing:
            keep_scores = scores[r, kept]
            scores[r] = float("-inf")
            scores[r, kept] = keep_scores
        if forcing or exploring:  # all such rows at once: a few kernels on a GPU, not per row
            import torch

            pinned = forcing + exploring
            rows = torch.tensor([r for r, _ in pinned], device=scores.device)
            tokens = torch.tensor([t for _, t in pinned], device=scores.device)
            keep = scores[rows, tokens]
            scores[rows] = float("-inf")
            scores[rows, tokens] = keep  # the one token left standing: the sampler takes it
            for r, _ in forcing:
                self.forced[r].append(self._step)
        self._step += 1
        return scores

    def _is_decision(self, row: int, groups: list[list[int]]) -> bool:
        """A choice where an exploring row explores: one made right after forced text (or
        first), the start of a value; or one right after such a decision that still has two
        options or more (the `0` or `]` after an access list's `[`, the rest of `s` when
        agents `sierra` and `scarlet` share it). Not a token inside free text (an escape's few
        allowed tokens), nor a name's continuation after its first token (one option)."""
        forced = self.forced[row]
        if self._step == 0 or (forced and forced[-1] == self._step - 1):
            return True
        return self._step - 1 in self.decisions[row] and len(groups) > 1

    def _explored_token(self, row: int, groups: list[list[int]]) -> int | None:
        """With probability explore[row], one of the decision's option `groups` uniformly and
        one of its tokens uniformly; else None (the model's own draw). Two uniforms from the
        row's explore generator, drawn at every decision: the second picks the group, and its
        fractional part the token within it."""
        import torch

        g = self._explore_generators[row]
        u, pick = torch.rand(2, generator=g).tolist() if g is not None else torch.rand(2).tolist()
        if u >= self.explore[row]:
            return None
        scaled = pick * len(groups)
        group = groups[min(int(scaled), len(groups) - 1)]
        return group[min(int((scaled % 1.0) * len(group)), len(group) - 1)]

    def _accept_and_fill(self, rows: list[int], last: list[int]) -> None:
        """Feed each row's matcher its last token, then fill its row of the bitmask: one row
        after the other, on this thread (the CPU path: the CPU's cores run the model)."""
        for r in rows:
            matcher = self._matchers[r]
            if self._started and not matcher.accept_token(int(last[r])):
                raise RuntimeError(f"the JSON grammar rejected token {int(last[r])}")
            matcher.fill_next_token_bitmask(self._bitmask, r)

    def _accept_and_fill_batch(self, rows: list[int], last: list[int]) -> None:
        """The same for a GPU batch, where the matchers are the step's cost rather than the
        model: xgrammar's batch matcher accepts and fills every row at once, on its own
        threads (the same bitmask row by row as `_accept_and_fill`)."""
        matchers = [self._matchers[r] for r in rows]
        if self._started:
            tokens = [int(last[r]) for r in rows]
            accepted = self._xgr.BatchGrammarMatcher.batch_accept_token(matchers, tokens)
            for ok, token in zip(accepted, tokens, strict=True):
                if not ok:
                    raise RuntimeError(f"the JSON grammar rejected token {token}")
        if self._batch_matcher is None:
            self._batch_matcher = self._xgr.BatchGrammarMatcher()
        self._batch_matcher.batch_fill_next_token_bitmask(matchers, self._bitmask, indices=rows)

    def _apply_bitmask(self, scores: Any, rows: list[int]) -> None:
        """Mask `rows` of `scores` where they are (on a GPU, xgrammar's Triton kernel). Should
        Triton be unusable there (it compiles a small launcher with the system's C compiler on
        first use), the process falls back to xgrammar's plain torch kernel, with a warning."""
        global _gpu_backend
        bitmask = self._bitmask.to(scores.device)
        backend: Any = _gpu_backend if scores.device.type == "cuda" else "auto"
        try:
            self._xgr.apply_token_bitmask_inplace(
                scores, bitmask, vocab_size=self._vocab_size, indices=rows, backend=backend)
        except Exception as e:
            if backend != "auto":
                raise
            log.warning("xgrammar's GPU kernel failed; masking with plain torch instead",
                        error=repr(e)[:300])
            _gpu_backend = "torch_native"
            self._xgr.apply_token_bitmask_inplace(
                scores, bitmask, vocab_size=self._vocab_size, indices=rows,
                backend=_gpu_backend)

    def _record_choice(self, row: int) -> list[int] | None:
        """Keep the row's allowed tokens at this step when they are few (a choice), and return
        them; a step with one allowed token (the end of turn after the closing brace) is
        forced."""
        import numpy as np
        import torch

        if self._bits is None:
            self._bits = torch.arange(32, dtype=torch.int32)
        words = self._bitmask[row]
        # more words set than a choice may have (numpy on the same memory: a row per plan and
        # step, where torch's per-call overhead would be most of the cost)
        if int(np.count_nonzero(words.numpy())) > CHOICE_MAX:
            return None
        allowed = ((words[:, None] >> self._bits) & 1).flatten()[: self._vocab_size].nonzero()
        if allowed.shape[0] == 1:
            self.forced[row].append(self._step)
        elif allowed.shape[0] <= CHOICE_MAX:
            tokens: list[int] = allowed[:, 0].tolist()
            self.choices[row][self._step] = tokens
            return tokens
        return None

    def _forced_token(self, matcher: Any, row: int) -> int | None:
        """The first token of the text the grammar forces next, when the grammar allows it."""
        text = matcher.find_jump_forward_string()
        if not text:
            return None
        tokens = self._encode(text)
        if not tokens:
            return None
        token = tokens[0]
        allowed = (int(self._bitmask[row, token // 32]) >> (token % 32)) & 1
        return token if token < self._vocab_size and allowed else None
