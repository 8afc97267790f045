"""Parallelism: a 4-way fan-out plus an aggregator against its critical-path bound.

    python -m tests.benchmarks.bench_parallel [--runs 5] [--latency 0.3]

The conductor answers at once with the plan

    step 0..3: four independent steps, access []      (they should run at the same time)
    step 4:    the aggregator, access "all"            (it waits for all four)

and every agent answers after `--latency` seconds (OpenAI wire format, scripted server). The
plan's critical path is two agent calls, so no engine can finish it faster than

    bound = fixed cost of a run + 2 x latency

where the fixed cost (workflow start, the plan activity, completion, result delivery) is
measured in the same process by a "plan only" run: the conductor's reply is not a plan and
max_plan_attempts=1, so that run is exactly one plan activity and nothing else. Printed: the
fan-out's wall time over that bound (goal <= 1.15), over the bare 2 x latency, and over
sequential execution of the same five calls (5 x latency + fixed cost, and a measured 5-step
chain run).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from temporalio.client import Client

from conductor_engine.engine.contracts.records import RunResult
from conductor_engine.runtime.client import ConductorClient
from conductor_engine.runtime.worker import build_worker
from tests.benchmarks._harness import (
    Series,
    answer_after,
    bench_pool,
    conduct,
    main_timing_runs,
    measure,
    ms,
    series_table,
    stack,
    table,
    verdict,
)
from tests.benchmarks._phases import print_phases

GOAL = 1.15
AGENTS = ["gpt-a", "gpt-b", "gpt-c", "gpt-d"]
AGGREGATOR = "gpt-agg"

PLANS: dict[str, list[dict[str, Any]]] = {
    "fanout": [
        *({"agent": a, "subtask": f"Research angle {i + 1}.", "access": []}
          for i, a in enumerate(AGENTS)),
        {"agent": AGGREGATOR, "subtask": "Combine the four findings.", "access": "all"},
    ],
    "chain": [
        {"agent": a, "subtask": f"Do part {i + 1}.", "access": [i - 1] if i else []}
        for i, a in enumerate([*AGENTS, AGGREGATOR])
    ],
    "single": [{"agent": AGENTS[0], "subtask": "Answer.", "access": []}],
}


def conductor_reply(prompt: str) -> str:
    """The conductor answers at once with the plan named in the question, or with no plan."""
    for name, steps in PLANS.items():
        if f"[plan={name}]" in prompt:
            return json.dumps({"steps": steps})
    return "I have no plan."


def overlap_check(res: RunResult) -> str:
    """How much the four independent steps overlapped, from the run's own step records."""
    secs = ", ".join(f"{s.seconds * 1000:.0f}" for s in res.steps[:4])
    return f"fan-out step durations in the last run (workflow clock): {secs} ms"


async def bench(args: argparse.Namespace) -> int:
    latency = args.latency
    with stack() as s:
        s.agents.set_responder("conductor", conductor_reply)
        answer_after(s.agents, [*AGENTS, AGGREGATOR], latency, "finding")
        client = await s.client()
        settings = s.queue("parallel")
        pool = bench_pool(s.agents.openai_base_url, [*AGENTS, AGGREGATOR])
        conductor = ConductorClient(client, settings, pool)
        last: dict[str, RunResult] = {}

        async def engine(plan: str | None, steps: int) -> str:
            question = f"[plan={plan}] Benchmark task." if plan else "Benchmark task."
            workflow_id, res = await conduct(conductor, question, steps)
            last[plan or "none"] = res
            return workflow_id

        kinds = {
            "plan only": lambda: engine(None, 0),
            "1 step": lambda: engine("single", 1),
            "fan-out 4 + aggregator": lambda: engine("fanout", 5),
            "chain of 5": lambda: engine("chain", 5),
        }
        async with build_worker(client, settings, pool):
            series = await measure(kinds, args)
        await report(client, series, latency)
        print(overlap_check(last["fanout"]))
    return 0


async def report(client: Client, series: dict[str, Series], latency: float) -> None:
    fixed = series["plan only"].median
    one = series["1 step"].median
    fan = series["fan-out 4 + aggregator"].median
    chain = series["chain of 5"].median
    print(series_table(list(series.values())))

    bound = fixed + 2 * latency
    sequential = fixed + 5 * latency
    ratio = fan / bound
    print(f"""
bounds (L = agent latency = {ms(latency)} ms; F = median "plan only" run = {ms(fixed)} ms, the
fixed cost of any run: start, one plan activity, completion, result):
  critical-path bound  = F + 2L = {ms(bound)} ms   (plan, then two agent calls back to back,
                                                  every step's own overhead counted as zero)
  sequential estimate  = F + 5L = {ms(sequential)} ms
""")
    rows = [
        ["fan-out / (F + 2L)   [critical-path bound]", f"{ratio:.3f}",
         f"goal <= {GOAL:.2f}: {verdict(ratio, GOAL)}"],
        ["fan-out / 2L         [agent latency only]", f"{fan / (2 * latency):.3f}",
         "no engine can reach 1.0"],
        ["fan-out / (1-step run + L)", f"{fan / (one + latency):.3f}",
         "bound with one step's overhead in F"],
        ["fan-out / (F + 5L)   [sequential estimate]", f"{fan / sequential:.3f}",
         f"ideal {bound / sequential:.3f}"],
        ["fan-out / chain of 5 [sequential, measured]", f"{fan / chain:.3f}",
         "same five calls, one after another"],
    ]
    print(table(["ratio", "value", "note"], rows))
    print(f"\nexcess over the critical-path bound: {ms(fan - bound)} ms "
          f"(the two step levels' own overhead, and the fan-out's four activities at once)\n")
    await print_phases(client, series,
                       ["plan only", "1 step", "fan-out 4 + aggregator", "chain of 5"])
    print()


def main(argv: list[str] | None = None) -> int:
    return main_timing_runs(bench, __doc__, latency=0.3, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
