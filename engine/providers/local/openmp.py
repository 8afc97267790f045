"""OpenMP threads that sleep while they wait, so a busy machine slows the local model down
instead of stopping it.

PyTorch's CPU kernels run on an OpenMP pool (one thread per core) whose idle threads spin by
default, waiting for the next parallel region. Decoding a small model is thousands of tiny
regions, and when other processes hold the cores, each region waits for spinning threads the
scheduler has put aside: measured on the 2-core machine beside a test suite (load 6), one
SmolLM2 plan took 65 s with spinning threads and 5.0 s with sleeping ones (and 8.9 s on one
thread); `python -m tests.benchmarks.bench_busy_cpu` measures it alone and under load. So the
engine asks for passive waiting before torch starts its OpenMP runtime, unless the user set
OMP_WAIT_POLICY themselves. It must run before the first `import torch` of the process; later,
it changes nothing.
"""

from __future__ import annotations

import os

POLICY_ENV = "OMP_WAIT_POLICY"


def wait_passively() -> None:
    """OMP_WAIT_POLICY=PASSIVE unless already set (read once, when OpenMP starts)."""
    os.environ.setdefault(POLICY_ENV, "PASSIVE")
