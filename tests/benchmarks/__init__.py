"""Benchmark scripts (run them as `python tests/benchmarks/bench_*.py`; pytest skips them)."""
