"""Streaming a checkpoint file into the blob store and back, against reading it whole.

The engine's way: `put_file(path)` (hash and copy in 4 MiB chunks; S3 multipart, 8 MiB parts) and
`get_to_file(ref, path)`. The baseline, what the trainer did before: `put(path.read_bytes())` and
`path.write_bytes(get(ref))`. Both on the same file (a few hundred MB of random bytes), each
into a fresh store so neither finds the blob already there. Prints median seconds for each,
their ratio, and the peak Python memory (tracemalloc, a separate pass so tracing does not
slow the timed one) as a share of the file's size: streaming should stay a few percent of the
file, reading it whole at least 100 %.

    python -m tests.benchmarks.bench_blob_streaming            # --mb N --runs N --s3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from conductor_engine.engine.storage.blobs import BlobStore, LocalBlobStore, S3BlobStore

MiB = 1024 * 1024
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}

Pass = Callable[[BlobStore, Path, Path], Awaitable[None]]


async def streamed(store: BlobStore, src: Path, back: Path) -> None:
    ref = await store.put_file(src)
    await store.get_to_file(ref, back)


async def whole(store: BlobStore, src: Path, back: Path) -> None:
    ref = await store.put(src.read_bytes())
    back.write_bytes(await store.get(ref))


def random_file(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        for _ in range(size // MiB):
            f.write(os.urandom(MiB))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def moto_server() -> Iterator[str]:
    """moto's S3 server in a process of its own, so this process's memory is the client's."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait()


async def timed(make: Callable[[], BlobStore], how: Pass, src: Path, work: Path) -> float:
    """Seconds of one pass into a fresh store."""
    back = work / f"back-{uuid.uuid4().hex[:6]}"
    store = make()
    start = time.perf_counter()
    await how(store, src, back)
    seconds = time.perf_counter() - start
    back.unlink()
    return seconds


async def peak(make: Callable[[], BlobStore], how: Pass, src: Path, work: Path) -> int:
    """Peak traced Python memory of one pass (allocations of every thread)."""
    tracemalloc.start()
    try:
        await how(make(), src, work / "traced")
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        (work / "traced").unlink(missing_ok=True)


async def compare(label: str, make: Callable[[], BlobStore], src: Path, work: Path,
                  runs: int) -> None:
    """The two ways interleaved, run after run, so a busy machine slows both alike."""
    size = src.stat().st_size
    times: dict[str, list[float]] = {"streamed": [], "whole": []}
    for _ in range(runs):
        times["streamed"].append(await timed(make, streamed, src, work))
        times["whole"].append(await timed(make, whole, src, work))
    s_time, w_time = (statistics.median(times[k]) for k in ("streamed", "whole"))
    s_peak, w_peak = await peak(make, streamed, src, work), await peak(make, whole, src, work)
    print(f"{label:<6} streamed {s_time:6.2f} s  peak {s_peak / MiB:7.1f} MiB "
          f"({s_peak / size:5.1%} of the file)")
    print(f"{'':<6} whole    {w_time:6.2f} s  peak {w_peak / MiB:7.1f} MiB "
          f"({w_peak / size:5.1%} of the file)")
    print(f"{'':<6} time streamed / whole {s_time / w_time:.2f}   "
          f"peak memory whole / streamed {w_peak / s_peak:.0f}x")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="file size in MiB")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--s3", action="store_true", help="also S3, on moto's server")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-blobs-"))
    try:
        src = random_file(work / "optimizer.safetensors", args.mb * MiB)
        print(f"file: {args.mb} MiB of random bytes; {args.runs} runs each, interleaved, medians")

        def local() -> BlobStore:
            return LocalBlobStore(work / f"store-{uuid.uuid4().hex[:6]}")

        await compare("local", local, src, work, args.runs)
        if args.s3:
            import boto3

            os.environ.update(AWS_ENV)
            with moto_server() as url:
                bucket = "bench"
                boto3.client("s3", endpoint_url=url).create_bucket(Bucket=bucket)

                def s3() -> BlobStore:
                    return S3BlobStore(bucket, uuid.uuid4().hex[:8], endpoint_url=url)

                await compare("s3", s3, src, work, args.runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
