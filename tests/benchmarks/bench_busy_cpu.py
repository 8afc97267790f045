"""The local conductor on a busy machine: OpenMP threads that spin against threads that sleep.

    python -m tests.benchmarks.bench_busy_cpu [--plans 3] [--load 2]

Each configuration runs in a fresh process (OMP_WAIT_POLICY is read once, when torch starts its
OpenMP runtime): the SmolLM2 conductor writes `--plans` seeded plans for a sim pool's task, one
after another, as a training rollout does, on an idle machine and beside `--load` processes that
keep a core busy each (plain Python loops, the way a test suite or another worker would). The
engine's choice is PASSIVE (engine/providers/local/openmp.py); ACTIVE is OpenMP's spinning default.
Printed: seconds per plan for each, and the ratio ACTIVE / PASSIVE (above 1: the engine's choice
is faster). Absolute times on a shared machine are noise; the ratio measured in the same run is
the figure.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.benchmarks._harness import table

CHILD = """
import asyncio, sys, time
from conductor_engine.engine.plan.language import plan_json_schema
from conductor_engine.engine.plan.prompts import conductor_messages
from conductor_engine.engine.providers.base import CompletionRequest
from conductor_engine.engine.providers.local import complete
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.providers.sim_pool import SimPoolSpec, pool_toml

path = sys.argv[1]
open(path, "w").write(pool_toml(SimPoolSpec(seed=1)))
pool = Pool.load(path)
msgs = conductor_messages("What is the capital of France?", pool.agents, max_steps=1,
                          json_mode=True)
schema = plan_json_schema([a.id for a in pool.agents], 1, subtask_max_chars=24)

async def main() -> None:
    req = CompletionRequest(messages=msgs, temperature=1.0, max_tokens=96, json_schema=schema,
                            schema_name="plan", seed=0)
    await complete(pool.conductor, req)  # load the model and compile the grammar
    started = time.perf_counter()
    for seed in range(1, int(sys.argv[2]) + 1):
        await complete(pool.conductor, req.model_copy(update={"seed": seed}))
    print((time.perf_counter() - started) / int(sys.argv[2]))

asyncio.run(main())
"""


def spin(stop: float) -> None:
    while time.monotonic() < stop:
        pass


def per_plan(policy: str, plans: int, load: int, workdir: Path) -> float:
    env = {**os.environ, "OMP_WAIT_POLICY": policy}
    stop = time.monotonic() + 3600
    hogs = [multiprocessing.Process(target=spin, args=(stop,), daemon=True) for _ in range(load)]
    for h in hogs:
        h.start()
    try:
        out = subprocess.run([sys.executable, "-c", CHILD, str(workdir / "pool.toml"), str(plans)],
                             env=env, capture_output=True, text=True, check=True, cwd=workdir)
    finally:
        for h in hogs:
            h.terminate()
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--plans", type=int, default=3)
    p.add_argument("--load", type=int, default=2, help="busy processes beside the model")
    args = p.parse_args()
    workdir = Path.cwd()  # the converted model is cached in ./.conductor, as for `conductor run`
    rows = []
    for load in (0, args.load):
        active = per_plan("ACTIVE", args.plans, load, workdir)
        passive = per_plan("PASSIVE", args.plans, load, workdir)
        rows.append([f"{load} busy processes", f"{active:.2f}", f"{passive:.2f}",
                     f"{active / passive:.2f}x"])
        print(rows[-1], flush=True)
    print(table(["machine", "ACTIVE s / plan", "PASSIVE s / plan (engine)", "ACTIVE / PASSIVE"],
                rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
