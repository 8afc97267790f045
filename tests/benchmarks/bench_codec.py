"""The cost of encrypting payloads: the engine's data converter with the codec against the same
converter without it (the pydantic converter and external storage, as every process has them).

    python -m tests.benchmarks.bench_codec [--count 2000] [--repeat 5]

Three payload sizes a run carries (a short agent reply, a long one, a step input holding the
outputs it may see, just under the 256 KiB external-storage threshold), each a pydantic model as
the workflow passes it. Each is encoded then decoded `--count` times per repeat through both
converters, interleaved; the figure is the best repeat. Prints payloads/s and MB/s of each and
the microseconds encryption adds to each round trip, and the ratio encrypted / plain time (no
servers; a few seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from temporalio.converter import DataConverter

from conductor_engine.engine.contracts.records import AgentReply
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.payloads import data_converter

SIZES = {"reply 1 KiB": 1 << 10, "reply 32 KiB": 32 << 10, "input 200 KiB": 200 << 10}


async def round_trips(converter: DataConverter, value: AgentReply, count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        payloads = await converter.encode([value])
        await converter.decode(payloads, [AgentReply])
    return time.perf_counter() - started


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        encrypted = data_converter(Settings(data_dir=Path(tmp)))
        plain = data_converter(Settings(data_dir=Path(tmp), payload_encryption=False))
        assert encrypted.payload_codec is not None and plain.payload_codec is None
        print(f"{'payload':<15} {'plain/s':>9} {'encrypted/s':>12} {'plain MB/s':>11} "
              f"{'enc MB/s':>9} {'added µs':>9} {'enc / plain time':>17}")
        for name, size in SIZES.items():
            value = AgentReply(output="x" * size, model="m")
            count = args.count if size <= 32 << 10 else max(20, args.count // 10)
            best = {"plain": float("inf"), "encrypted": float("inf")}
            for _ in range(args.repeat):
                for label, converter in (("plain", plain), ("encrypted", encrypted)):
                    best[label] = min(best[label], await round_trips(converter, value, count))
            mb = size * count / 1e6
            print(f"{name:<15} {count / best['plain']:>9.0f} {count / best['encrypted']:>12.0f} "
                  f"{mb / best['plain']:>11.0f} {mb / best['encrypted']:>9.0f} "
                  f"{(best['encrypted'] - best['plain']) / count * 1e6:>9.0f} "
                  f"{best['encrypted'] / best['plain']:>17.2f}")


if __name__ == "__main__":
    asyncio.run(main())
