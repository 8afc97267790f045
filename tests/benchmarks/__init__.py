"""Benchmark scripts (run one as `python -m tests.benchmarks.bench_NAME` from the repository
root; pytest skips them)."""
