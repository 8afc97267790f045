"""`conductor serve` under attack: a keyed client's latency while hostile clients run, against
its latency with none, in the same run.

    python -m tests.benchmarks.bench_serve_attacks [--quiet-s 3]

The real `conductor serve` (a subprocess, under an open-file limit of 1,024, as a default
shell has it) on the benchmark stack's Temporal and PostgreSQL. A keyed client asks GET
/v1/models on a fresh connection, one request after another, first with nothing else going on
(the baseline), then during each attack of tests/serve_attacks.py: one endless header (up to
64 MiB), 1,100 half-sent requests held for 1.5 s, a keyed body of one-byte chunks, and two
keyed 8 MiB bodies of tiny messages and content parts. Printed for each: the answers, their
median and slowest latency, and the median over the baseline's (goal: every answer within a
second).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from conductor_engine.runtime.serve.access import API_KEYS_ENV
from tests.benchmarks._harness import free_port, ms, quiet_logs, run, stack, table
from tests.cli import CONDUCTOR, stack_env
from tests.conftest import make_pool, write_pool
from tests.serve_attacks import (
    answers_while,
    endless_header,
    get_models,
    half_sent_requests,
    limit_server_files,
    post_chat,
    raise_own_files,
    tiny_chunks,
    tiny_objects_bodies,
)

KEY = "sk-bench-attacks"


async def main(args: argparse.Namespace) -> int:
    quiet_logs("error")
    if not raise_own_files(1100 + 1024):
        print("this process may not open the 2,124 files the 1,100 connections need")
        return 1
    bodies = tiny_objects_bodies()
    attacks: list[tuple[str, Callable[[int], Awaitable[Any]]]] = [
        ("none (baseline)", lambda port: asyncio.sleep(args.quiet_s)),
        ("one endless header", lambda port: endless_header(port)),
        ("1,100 half-sent requests", lambda port: half_sent_requests(port)),
        ("a body of one-byte chunks", lambda port: tiny_chunks(port, KEY)),
        ("two 8 MiB bodies of tiny objects",
         lambda port: asyncio.gather(*(post_chat(port, KEY, b) for b in bodies))),
    ]
    with stack() as s, tempfile.TemporaryDirectory() as tmp:
        settings = s.queue("attacks")
        port = free_port()
        env = {**stack_env(settings, write_pool(make_pool(s.agents), Path(tmp) / "pool.toml")),
               API_KEYS_ENV: KEY}
        proc = await asyncio.create_subprocess_exec(
            *CONDUCTOR, "serve", "--port", str(port), "--no-worker", env=env, cwd=tmp,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            preexec_fn=limit_server_files)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    await get_models(port, KEY)
                    break
                except (ConnectionError, OSError):
                    assert proc.returncode is None and time.monotonic() < deadline
                    await asyncio.sleep(0.2)
            rows = []
            baseline = 0.0
            for name, attack in attacks:
                _, took = await answers_while(attack(port), port, KEY)
                median = statistics.median(took)
                baseline = baseline or median
                rows.append([name, len(took), ms(median), ms(max(took)),
                             f"{median / baseline:.1f}x"])
                print(f"{name}: {len(took)} answers, slowest {ms(max(took))} ms", flush=True)
        finally:
            proc.terminate()
            await proc.wait()
    print(table(["attack", "answers", "median ms", "slowest ms", "median / baseline"], rows))
    slowest = max(float(r[3]) for r in rows) / 1000
    print(f"slowest keyed answer under attack: {slowest:.2f} s (goal < 1 s)")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quiet-s", type=float, default=3.0,
                        help="seconds of the baseline, with no attack")
    sys.exit(run(lambda: main(parser.parse_args())))
