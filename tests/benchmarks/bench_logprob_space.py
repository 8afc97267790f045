"""How far a server's log-probs are from the trainer's, on the same tokens of real plans.

    CONDUCTOR_DATA_DIR=... python -m tests.benchmarks.bench_logprob_space [--plans 8]

vLLM returns, for each sampled token, its log-probability over the whole vocabulary from the
raw logits (before the grammar's mask). The trainer scores a plan's decisions over the few
tokens the grammar allowed there (a choice set, trainer/grpo/_logprobs.py) and leaves forced
tokens out.
This script samples `--plans` real plans from SmolLM2-135M-Instruct with the local provider
(under the real plan grammar, reasoning first), then scores the same tokens four ways, all on
this CPU:

- `recorded`: the local sampler's own log-probs (renormalised over choice sets): the baseline,
  in the trainer's space by construction;
- `server fp32`: the full-vocabulary log-softmax of the same model in float32, what vLLM's
  default `logprobs` are;
- `server bf16` (with `--bf16`): the same in bfloat16, as a GPU server runs it (slow on a CPU
  without bfloat16 instructions: minutes a plan);
- `trainer`: trainer.grpo.per_token_logprobs on the reconstructed records (float32).

It prints, per kind of position (choice, free text), the mean and largest |difference| to the
trainer's log-probs and the share of tokens whose importance ratio exp(trainer - other) falls
outside GRPO's clip range [0.8, 1.28]: a token there would have its gradient clipped from the
first optimiser step. docs/results/served-conductor.md quotes a run.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import math
import statistics
from typing import Any

CLIP_LOW, CLIP_HIGH = 0.8, 1.28  # 1 - epsilon_low, 1 + epsilon_high (the recipe's defaults)


def plans(n: int, max_tokens: int) -> tuple[Any, list[Any], list[Any]]:
    """The loaded model, the requests and their completions: `n` plans, sampled together."""
    from conductor_engine.engine.plan.language import plan_json_schema
    from conductor_engine.engine.plan.prompts import conductor_messages
    from conductor_engine.engine.providers import local
    from conductor_engine.engine.providers.base import CompletionRequest
    from conductor_engine.engine.providers.pool import AgentSpec

    spec = AgentSpec(id="smollm2", provider="local", model=local.SMOLLM2)
    agents = [AgentSpec(id=i, provider="sim", model="sim", description=d) for i, d in
              (("alpha", "Solves maths."), ("bravo", "Checks answers."), ("charlie", "Codes."))]
    schema = plan_json_schema([a.id for a in agents], 3, subtask_max_chars=120,
                              reasoning_max_chars=160)
    messages = conductor_messages("Add 17 and 25, then check the sum.", agents, max_steps=3,
                                  json_mode=True, reasoning_max_chars=160)
    requests = [CompletionRequest(messages=messages, temperature=1.0, max_tokens=max_tokens,
                                  json_schema=schema, seed=k) for k in range(n)]

    async def sample() -> list[Any]:
        return list(await asyncio.gather(*(local.complete(spec, r) for r in requests)))

    loaded = local.load_model(spec)
    return loaded, requests, asyncio.run(sample())


def full_vocabulary(model: Any, prompt: list[int], completion: list[int]) -> list[float]:
    """log softmax over the whole vocabulary of each completion token: a server's logprobs."""
    import torch

    ids = torch.tensor([prompt + completion])
    with torch.inference_mode():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt):, None])[:, 0].tolist()


def trainer_logprobs(model: Any, sample: Any, pad_id: int) -> list[float]:
    import torch

    from conductor_engine.trainer.grpo import collate, per_token_logprobs

    with torch.inference_mode():
        return per_token_logprobs(model, collate([sample], pad_id))[0].tolist()  # type: ignore[no-any-return]


def row(name: str, gaps: list[float]) -> str:
    if not gaps:
        return f"{name:<34} {'-':>6}"
    out = sum(not CLIP_LOW <= math.exp(g) <= CLIP_HIGH for g in gaps) / len(gaps)
    return (f"{name:<34} {len(gaps):>6} {statistics.fmean(abs(g) for g in gaps):>10.4f} "
            f"{max(abs(g) for g in gaps):>10.4f} {100 * out:>9.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plans", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--bf16", action="store_true", help="also score in bfloat16")
    args = parser.parse_args()

    from conductor_engine.engine.providers.local.openmp import wait_passively

    wait_passively()  # before torch's first import (see openmp.py): a busy CPU otherwise stalls
    import torch

    from conductor_engine.engine.providers.local.chat import prompt_ids
    from conductor_engine.engine.providers.local.reconstruct import Records, Vocabulary
    from conductor_engine.trainer.grpo import Sample

    torch.manual_seed(0)
    loaded, requests, done = plans(args.plans, args.max_tokens)
    model = loaded.model
    bf16 = copy.deepcopy(model).to(torch.bfloat16) if args.bf16 else None
    print(f"{len(done)} plans sampled", flush=True)
    vocab = Vocabulary.of(model, loaded.tokenizer)
    pad = loaded.tokenizer.eos_token_id
    gaps: dict[str, list[float]] = {}
    equal = 0
    for request, c in zip(requests, done, strict=True):
        rebuilt = vocab.reconstruct(request.json_schema, c.token_ids)
        assert isinstance(rebuilt, Records)
        equal += rebuilt == Records(c.forced_positions, c.choice_tokens)
        prompt = prompt_ids(loaded.tokenizer, request)
        forced = set(rebuilt.forced_positions)
        sample = Sample(prompt_ids=prompt, completion_ids=c.token_ids, advantage=1.0,
                        forced=[k in forced for k in range(len(c.token_ids))],
                        choices=rebuilt.choice_tokens or None)
        trainer = trainer_logprobs(model, sample, pad)
        sides = {"recorded": c.logprobs,
                 "server fp32": full_vocabulary(model, prompt, c.token_ids)}
        if bf16 is not None:
            sides["server bf16"] = full_vocabulary(bf16, prompt, c.token_ids)
        for k in range(len(c.token_ids)):
            if k in forced:
                continue
            kind = "choice" if k in rebuilt.choice_tokens else "free"
            for side, values in sides.items():
                gaps.setdefault(f"{side} vs trainer, {kind}", []).append(trainer[k] - values[k])
    tokens = sum(len(c.token_ids) for c in done)
    print(f"{len(done)} plans of SmolLM2-135M-Instruct, {tokens} tokens; rebuilt records equal "
          f"the recorded ones on {equal} of {len(done)}")
    print(f"{'log-probs compared':<34} {'tokens':>6} {'mean |d|':>10} {'max |d|':>10} "
          f"{'ratio out of clip':>10}")
    for name in sorted(gaps):
        print(row(name, gaps[name]))


if __name__ == "__main__":
    main()
