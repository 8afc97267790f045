"""Engine overhead: a 5-step sequential conductor run against a bare Temporal workflow.

    python -m tests.benchmarks.bench_overhead [--runs 5] [--latency 0.2]

Engine: ConductWorkflow on the engine's own worker (runtime.worker.build_worker). The
conductor
answers at once with a 5-step chain (step 0 access [], step i access [i-1]); every step's agent
is called through the OpenAI SDK and the scripted agent server answers after `--latency`
seconds. So one engine run is 1 plan activity + 5 agent activities.

Bare: a workflow defined in this file, on its own worker and task queue, same client (pydantic
data converter), same sandboxed workflow runner, calling five plain activities one after the
other, each doing `await asyncio.sleep(latency)`.

Printed: medians of each kind of run, the ratio engine/bare (goal <= 1.10), the per-step
overhead in ms (two ways), and where the time goes, from each run's Temporal history.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import uuid
from datetime import timedelta

from pydantic import BaseModel
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

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
    verdict,
)
from tests.benchmarks._phases import print_phases

GOAL = 1.10
AGENT = "gpt"


# ------------------------------------------------------------------------------ the baseline


class BareInput(BaseModel):
    steps: int
    sleep_s: float


class BareStep(BaseModel):
    index: int
    sleep_s: float
    previous: str = ""


class BareReply(BaseModel):
    output: str


@activity.defn(name="bare_step")
async def bare_step(req: BareStep) -> BareReply:
    await asyncio.sleep(req.sleep_s)
    return BareReply(output=f"step {req.index} done after {req.previous or 'nothing'}")


@workflow.defn(name="BareWorkflow")
class BareWorkflow:
    """The obvious hand-written baseline: N activities in a row, each given the previous
    output, with the same kind of timeouts and retry policy a conductor step gets."""

    @workflow.run
    async def run(self, inp: BareInput) -> list[str]:
        outputs: list[str] = []
        for i in range(inp.steps):
            reply = await workflow.execute_activity(
                bare_step,
                BareStep(index=i, sleep_s=inp.sleep_s, previous=outputs[-1] if outputs else ""),
                start_to_close_timeout=timedelta(seconds=120),
                schedule_to_close_timeout=timedelta(seconds=900),
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                    maximum_interval=timedelta(seconds=60), maximum_attempts=5,
                ),
            )
            outputs.append(reply.output)
        return outputs


def bare_worker(client: Client, task_queue: str) -> Worker:
    # The sandbox, as for the engine's workflow, but this module (the workflow's own) is passed
    # through: it is imported once, not re-run for every workflow run, and its pydantic models
    # are built once (the engine keeps its models outside its workflow module, alike).
    runner = SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules(__name__)
    )
    return Worker(
        client, task_queue=task_queue, workflows=[BareWorkflow], activities=[bare_step],
        workflow_runner=runner,
    )


# ------------------------------------------------------------------------------ the engine's side

_STEPS = re.compile(r"\[steps=(\d+)\]")


def chain_plan(steps: int) -> str:
    """A sequential plan: step 0 sees nothing, step i sees step i-1."""
    return json.dumps({"steps": [
        {"agent": AGENT, "subtask": f"Do part {i + 1} of the work.", "access": [i - 1] if i else []}
        for i in range(steps)
    ]})


def conductor_reply(prompt: str) -> str:
    """The conductor answers at once: a chain of [steps=N] steps, or no plan at all."""
    m = _STEPS.search(prompt)
    return chain_plan(int(m[1])) if m else "I have no plan."


async def bench(args: argparse.Namespace) -> int:
    latency = args.latency
    with stack() as s:
        s.agents.set_responder("conductor", conductor_reply)
        answer_after(s.agents, [AGENT], latency, "done")
        client = await s.client()
        engine_settings, bare_settings = s.queue("engine"), s.queue("bare")
        pool = bench_pool(s.agents.openai_base_url, [AGENT])
        conductor = ConductorClient(client, engine_settings, pool)

        async def engine(steps: int) -> str:
            question = f"[steps={steps}] Benchmark task." if steps else "Benchmark task."
            workflow_id, _ = await conduct(conductor, question, steps)
            return workflow_id

        async def bare(steps: int) -> str:
            workflow_id = f"bare-{steps}-{uuid.uuid4().hex[:12]}"
            out = await client.execute_workflow(
                BareWorkflow.run, BareInput(steps=steps, sleep_s=latency), id=workflow_id,
                task_queue=bare_settings.task_queue,
            )
            if len(out) != steps:
                raise RuntimeError(f"unexpected bare run: {out}")
            return workflow_id

        kinds = {
            "bare, 5 activities": lambda: bare(5),
            "engine, plan + 5 steps": lambda: engine(5),
            "bare, 1 activity": lambda: bare(1),
            "engine, plan + 1 step": lambda: engine(1),
            "engine, plan only": lambda: engine(0),
        }
        async with build_worker(client, engine_settings, pool), \
                bare_worker(client, bare_settings.task_queue):
            series = await measure(kinds, args)
        return await report(client, series, latency)


async def report(client: Client, series: dict[str, Series], latency: float) -> int:
    b5, e5 = series["bare, 5 activities"].median, series["engine, plan + 5 steps"].median
    b1, e1 = series["bare, 1 activity"].median, series["engine, plan + 1 step"].median
    e0 = series["engine, plan only"].median
    print(series_table(list(series.values())))

    ratio = e5 / b5
    all_in = (e5 - b5) / 5
    e_step, b_step = (e5 - e1) / 4, (b5 - b1) / 4
    e_fixed, b_fixed = e1 - e_step, b1 - b_step
    print(f"""
ratio engine (plan + 5 steps) / bare (5 activities) = {e5 * 1000:.0f} / {b5 * 1000:.0f} ms \
= {ratio:.3f}   goal <= {GOAL:.2f}: {verdict(ratio, GOAL)}
  (the engine run includes one more activity than the bare one: the plan call, answered at once)

per-step overhead of the engine, two ways:
  all-in:      (engine 5 - bare 5) / 5                 = {ms(all_in)} ms per step \
(plan call, start and finish included)
  incremental: engine (5 - 1 step) / 4 = {ms(e_step)} ms per step = latency \
{ms(latency)} + {ms(e_step - latency)} ms
               bare   (5 - 1 act.) / 4 = {ms(b_step)} ms per step = latency \
{ms(latency)} + {ms(b_step - latency)} ms
               the engine's own cost per step, beyond a bare activity: \
{(e_step - b_step) * 1000:+.0f} ms
fixed cost of a run (1-step run minus one incremental step; a difference of differences, noisy):
  engine {ms(e_fixed)} ms, bare {ms(b_fixed)} ms: the engine adds {ms(e_fixed - b_fixed)} ms \
per run (plan activity, bigger workflow)
  a plan-only engine run (one plan activity, the plan rejected): {ms(e0)} ms
""")
    phases = await print_phases(
        client, series, ["bare, 5 activities", "engine, plan + 5 steps"],
        ["bare, 1 activity", "engine, plan + 1 step", "engine, plan only"])
    bp, ep = phases["bare, 5 activities"], phases["engine, plan + 5 steps"]
    print(f"\nactivity running minus the latency, per activity: bare "
          f"{(bp['activity running'] - 5 * latency) / bp['activities'] * 1000:.1f} ms, engine "
          f"{(ep['activity running'] - 5 * latency) / ep['activities'] * 1000:.1f} ms "
          f"(engine: 6 activities, 5 of them waiting {ms(latency)} ms)")
    return 0


def main(argv: list[str] | None = None) -> int:
    return main_timing_runs(bench, __doc__, latency=0.2, argv=argv)


if __name__ == "__main__":
    # Run under the module's package name, so that the workflow's module is importable by name
    # (the sandbox passes it through) and not re-run as __main__ inside the sandbox.
    from tests.benchmarks import bench_overhead

    sys.exit(bench_overhead.main())
