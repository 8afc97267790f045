"""How the local model picks each token, and the log-probabilities the trainer needs.

transformers samples with `torch.multinomial`, which on a CPU costs more per step for a batch of
plans than the forward pass of a small model. `Sampler` draws from the same distribution by
inverse CDF and leaves `generate` running greedy (bench_local_sampling.py measures the gain).
The behaviour log-probabilities are computed from each step's raw logits (renormalised over a
grammar's few allowed tokens at a choice), as the trainer recomputes them, while the step runs:
`StepLogprobs` keeps one number per row and step, never a step's logits.
"""

from __future__ import annotations

from typing import Any

from conductor_engine.engine.providers.base import CompletionRequest


class Sampler:
    """The last logits processor of a sampled batch: it draws each row's next token from
    softmax(scores / temperature), cut to the top-p nucleus, and leaves only that token
    standing, so `generate` runs greedy and merely takes it.

    Inverse-CDF sampling (one uniform draw per row, located in the cumulative sum) draws from
    the distribution `torch.multinomial` draws from, at a fraction of its cost on a CPU.

    A row whose request carries a `seed` draws from a generator of its own seeded by it, so its
    draws depend on its seed alone, never on which requests share its batch or in what order
    (its logits do, in their last bits: batching.Job.batch_key); a row without one draws from
    torch's global generator.
    """

    def __init__(self, temperature: float, top_p: float,
                 seeds: list[int | None] | None = None) -> None:
        self.temperature, self.top_p = temperature, top_p
        self.generators = row_generators(seeds or [])

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        probs = torch.softmax(scores.float() / self.temperature, dim=-1)
        if self.top_p < 1.0:
            probs = nucleus(probs, self.top_p)
        tokens = sample_rows(probs, self.generators)
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(1, tokens[:, None], 0.0)
        return out


def row_generators(seeds: list[int | None]) -> list[Any]:
    """A torch.Generator per seeded row (seeded with it), None for a row without a seed.

    Always a CPU generator, even when the model runs on a GPU: a row draws one uniform per
    step, a scalar that costs nothing to copy, and a CPU generator's stream is the same on
    every machine, so a seed gives the same draws on a GPU box as on a laptop (a CUDA
    generator's stream differs from the CPU's for the same seed)."""
    import torch

    return [None if s is None else torch.Generator().manual_seed(s % 2**63) for s in seeds]


def sample_rows(probs: Any, generators: list[Any] | None = None) -> Any:
    """One token per row of `probs` (rows need not be normalised), by inverse CDF.

    `right=True` skips the zero-probability tokens a grammar masked out; the second search is
    the last token with any probability, where a draw that rounds up to the total lands. The
    float32 sum is off by about 1e-7 of the mass, a bias no sampled token's logprob (computed
    apart, from the raw logits) carries. Row r's uniform comes from `generators[r]` when that is
    set (one draw per row and step, so a seeded row's sequence of draws is its own)."""
    import torch

    cdf = probs.float().cumsum(-1)
    total = cdf[:, -1:].contiguous()
    u = torch.rand(total.shape, dtype=cdf.dtype, device=cdf.device)
    seeded = [(r, g) for r, g in enumerate(generators or []) if g is not None]
    if seeded:  # drawn on the CPU (see row_generators), copied to the logits' device at once
        draws = torch.stack([torch.rand((), dtype=cdf.dtype, generator=g) for _, g in seeded])
        rows = torch.tensor([r for r, _ in seeded], device=cdf.device)
        u[rows, 0] = draws.to(cdf.device)
    u = u * total
    token = torch.searchsorted(cdf, u, right=True)
    last = torch.searchsorted(cdf, total, right=False)
    return torch.minimum(token, last)[:, 0]


def nucleus(probs: Any, top_p: float) -> Any:
    """`probs` with every token outside the smallest set whose mass reaches top_p zeroed (the
    most likely token always stays), as transformers' TopPLogitsWarper keeps."""
    import torch

    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(-1) - sorted_probs  # the mass of the tokens ranked above
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter_(1, order, before < top_p * (
        sorted_probs.sum(-1, keepdim=True)))
    return probs * keep


def sampling_options(
    request: CompletionRequest, seeds: list[int | None] | None = None,
) -> tuple[dict[str, Any], list[Any]]:
    """`generate`'s options and the trailing logits processors: greedy for temperature None or
    0; otherwise sampling at the request's temperature and top_p (top-k off, so the sampling
    distribution is exactly the one described) by `Sampler`, with `generate` itself greedy.
    `seeds`, one per row of the batch (the requests' `seed`), seed the rows that have one."""
    if not request.temperature or request.temperature <= 0:
        return {"do_sample": False}, []
    top_p = request.top_p if request.top_p is not None else 1.0
    return {"do_sample": False}, [Sampler(request.temperature, top_p, seeds)]


def sampled_logprobs(logits: tuple[Any, ...], tokens: Any, temperature: float | None,
                     choices: list[dict[int, list[int]]] | None = None,
                     explore: list[float] | None = None,
                     decisions: list[dict[int, dict[int, float]]] | None = None) -> Any:
    """Log-probability of each sampled token (`tokens`, batch × steps) under the model at the
    sampling temperature, batch × steps, from every step's raw logits (`logits`, one batch ×
    vocabulary tensor per step): `step_logprobs` step after step. The provider itself keeps no
    step's logits (`StepLogprobs` records each step as it is sampled); this is the same
    arithmetic over logits kept by someone else (a test, a benchmark)."""
    import torch

    scale = temperature if temperature and temperature > 0 else 1.0
    return torch.stack([
        step_logprobs(step, tokens[:, k], scale, k, choices, explore, decisions)
        for k, step in enumerate(logits)
    ], dim=1)


def step_logprobs(raw: Any, tokens: Any, scale: float, k: int,
                  choices: list[dict[int, list[int]]] | None = None,
                  explore: list[float] | None = None,
                  decisions: list[dict[int, dict[int, float]]] | None = None) -> Any:
    """Log-probability of each row's token at step `k` (`tokens`, one per row) under the
    model at temperature `scale`, from the step's raw logits (`raw`, batch × vocabulary): one
    log-softmax over the batch.

    From the raw logits, before the grammar mask and top-p, except at a row's choices (row ->
    step -> the few tokens its grammar allowed, grammar.GrammarMask): there the softmax runs
    over the allowed tokens only, the distribution the choice was drawn from. The trainer
    scores each token in the same space (trainer/grpo/_logprobs.py), so the GRPO importance ratio is
    exactly 1 for an on-policy rollout. Tokens a JSON grammar forces carry their unconstrained
    probability; the trainer leaves them out.

    At a row's `decisions` (grammar.GrammarMask: step -> token -> q(token), the exploring
    draw's distribution: uniform over the decision's options, then over an option's tokens),
    where it explored with probability epsilon = `explore[r]`, the token was drawn from the
    mixture
        mu(t) = (1 - epsilon) * p_C(t) + epsilon * q(t)       (C: the allowed tokens)
    and its behaviour log-prob is log mu(t): the trainer's ratio pi/mu then weighs an explored
    choice by how likely the policy itself makes it. A row given epsilon 0 here (an exploring
    request without `explore_importance`) keeps the policy's log-prob p_C(t) there.
    """
    import torch

    out = torch.log_softmax(raw.float() / scale, dim=-1).gather(1, tokens[:, None])[:, 0]
    for r, steps in enumerate(choices or []):
        allowed = steps.get(k)
        if allowed is not None:
            z = raw[r].float() / scale
            out[r] = z[tokens[r]] - torch.logsumexp(z[allowed], dim=0)
    for r, steps_ in enumerate(decisions or []):
        eps = explore[r] if explore else 0.0
        q = steps_.get(k)
        if q is not None and eps and choices is not None and k in choices[r]:
            explored = torch.tensor(eps * q.get(int(tokens[r]), 0.0))
            out[r] = torch.log((1 - eps) * out[r].exp() + explored)
    return out


class StepLogprobs:
    """The behaviour log-probabilities recorded while a batch generates, one small vector per
    step: never a step's whole logits past the step that used them.

    Two logits processors around the others: `first` (put first) holds the step's raw logits,
    and the recorder itself (put last) reads the token the step took (the only one the sampler
    left standing, or the greedy argmax: what `generate` takes, by the same `argmax`) and
    keeps that token's log-probability (`step_logprobs`, with the grammar's records of this
    step: `mask.choices`, `mask.decisions`). Kept per step: one float per row; the raw logits
    are dropped as soon as the step is recorded. `kept` counts what it keeps, so a test can
    measure that memory grows with tokens, not tokens times vocabulary.
    """

    def __init__(self, temperature: float | None, mask: Any = None,
                 explore: list[float] | None = None) -> None:
        self.scale = temperature if temperature and temperature > 0 else 1.0
        self.mask, self.explore = mask, explore
        self.steps: list[Any] = []
        self._raw: Any = None

    def first(self, input_ids: Any, scores: Any) -> Any:
        """The first logits processor: hold the raw logits (the processors after it copy
        before they write: grammar.GrammarMask clones, Sampler builds a new tensor)."""
        self._raw = scores
        return scores

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        tokens = scores.argmax(dim=-1)
        mask = self.mask
        self.steps.append(step_logprobs(
            self._raw, tokens, self.scale, len(self.steps),
            mask.choices if mask is not None else None, self.explore,
            mask.decisions if mask is not None else None))
        self._raw = None
        return scores

    @property
    def kept(self) -> int:
        """Elements of the tensors kept so far (the log-probs: one per row and step)."""
        return sum(int(s.numel()) for s in self.steps) + (
            0 if self._raw is None else int(self._raw.numel()))

    def logprobs(self, steps: int) -> Any:
        """batch × `steps`: the first `steps` recorded steps (a `generate` that ran a step past
        its end and undid it recorded one more)."""
        import torch

        return torch.stack(self.steps[:steps], dim=1)
