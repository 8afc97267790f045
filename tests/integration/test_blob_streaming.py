"""Streaming checkpoint files through the blob store (put_file / get_to_file), local and on S3
(moto's real S3 wire-format server): the same address as `put(bytes)`, multipart above one
part, and memory that does not grow with the file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from conductor_engine.engine.storage.blobs import (
    BlobCorrupt,
    BlobNotFound,
    BlobStore,
    LocalBlobStore,
    S3BlobStore,
    key_for,
    ref_for,
)
from tests.blob_stores import AWS_ENV, fresh_bucket, stored_objects

MiB = 1024 * 1024
PART = 5 * MiB  # S3's smallest part: a file of a few parts stays quick on moto


def s3_store(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> S3BlobStore:
    bucket = fresh_bucket(moto_url, monkeypatch)
    return S3BlobStore(bucket, "runs/", endpoint_url=moto_url, part_size=PART, max_concurrency=2)


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    if request.param == "local":
        return LocalBlobStore(tmp_path / "blobs")
    return s3_store(request.getfixturevalue("moto_url"),
                    request.getfixturevalue("monkeypatch"))


def random_file(path: Path, size: int, seed: int = 0) -> Path:
    """`size` deterministic, incompressible bytes, written a MiB at a time."""
    import random

    rng = random.Random(seed)
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, MiB)
            f.write(rng.randbytes(n))
            left -= n
    return path


async def test_a_file_larger_than_a_part_round_trips_at_its_bytes_address(
        store: BlobStore, tmp_path: Path) -> None:
    src = random_file(tmp_path / "optimizer.safetensors", 2 * PART + 12345)
    data = src.read_bytes()
    ref = await store.put_file(src)
    assert ref == ref_for(data)
    assert await store.put(data) == ref  # one blob, whichever way it came in
    assert [k for k in stored_objects(store) if "sha256" in k] == [
        k for k in stored_objects(store) if k.endswith(key_for(ref))]
    out = tmp_path / "back" / "optimizer.safetensors"
    await store.get_to_file(ref, out)
    assert out.read_bytes() == data
    assert await store.size(ref) == len(data)
    if isinstance(store, S3BlobStore):  # a multipart object's ETag says how many parts
        obj = store.client.head_object(Bucket=store.bucket, Key=store.object_key(key_for(ref)))
        assert obj["ETag"].strip('"').endswith("-3")


async def test_put_file_of_stored_content_leaves_one_blob_and_no_temporaries(
        store: BlobStore, tmp_path: Path) -> None:
    src = random_file(tmp_path / "a", 3 * MiB)
    first = await store.put_file(src)
    assert await store.put_file(src) == first
    assert stored_objects(store) == [k for k in stored_objects(store) if k.endswith(key_for(first))]


async def test_get_to_file_of_a_missing_blob_says_so_and_writes_nothing(
        store: BlobStore, tmp_path: Path) -> None:
    ref = ref_for(b"never stored")
    with pytest.raises(BlobNotFound, match=ref):
        await store.get_to_file(ref, tmp_path / "out" / "x")
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


async def test_a_corrupt_blob_is_refused_and_the_target_left_alone(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "blobs")
    ref = await store.put_file(random_file(tmp_path / "a", MiB))
    store.path(key_for(ref)).write_bytes(b"tampered")
    target = tmp_path / "out"
    target.write_bytes(b"before")
    with pytest.raises(BlobCorrupt, match=ref):
        await store.get_to_file(ref, target)
    assert target.read_bytes() == b"before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "blobs", "out"]


async def test_deleting_a_blob_removes_it_once(store: BlobStore) -> None:
    ref = await store.put(b"a checkpoint no version keeps")
    await store.delete(ref)
    assert not await store.exists(ref) and await store.size(ref) is None
    await store.delete(ref)  # already gone: nothing to do


SIZE = 64 * MiB  # the streamed file; peak memory must stay far below it


async def test_streaming_a_local_file_holds_a_chunk_not_the_file(tmp_path: Path) -> None:
    src = random_file(tmp_path / "big", SIZE)
    store = LocalBlobStore(tmp_path / "blobs")
    tracemalloc.start()
    try:
        ref = await store.put_file(src)
        await store.get_to_file(ref, tmp_path / "back")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < SIZE / 4, f"peak {peak / MiB:.1f} MiB streaming a {SIZE // MiB} MiB file"
    assert (tmp_path / "back").stat().st_size == SIZE


_CLIENT = """
import asyncio, json, sys, tracemalloc
from pathlib import Path
from conductor_engine.engine.storage.blobs import S3BlobStore

async def main(url, bucket, src, back, part):
    store = S3BlobStore(bucket, "runs/", endpoint_url=url, part_size=part, max_concurrency=2)
    await store.check()  # boto3's client and its imports, before measuring
    tracemalloc.start()
    ref = await store.put_file(Path(src))
    await store.get_to_file(ref, Path(back))
    print(json.dumps({"ref": ref, "peak": tracemalloc.get_traced_memory()[1]}))

asyncio.run(main(*sys.argv[1:5], int(sys.argv[5])))
"""


def test_streaming_to_s3_holds_parts_not_the_file(
        moto_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Measured in a process of its own: moto's server runs in this one and holds the upload."""
    bucket = fresh_bucket(moto_url, monkeypatch)
    src = random_file(tmp_path / "big", SIZE)
    done = subprocess.run(
        [sys.executable, "-c", _CLIENT, moto_url, bucket, str(src), str(tmp_path / "back"),
         str(PART)],
        env={**os.environ, **AWS_ENV}, capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["peak"] < SIZE / 2, f"peak {result['peak'] / MiB:.1f} MiB for {SIZE // MiB} MiB"
    assert (tmp_path / "back").read_bytes() == src.read_bytes()


def test_a_file_too_big_for_10000_parts_gets_larger_parts() -> None:
    """S3 refuses an upload of more than 10,000 parts: 8 MiB parts stop at 80 GB."""
    store = S3BlobStore("bucket", client=object())
    size = 200 * 1024**3  # a 200 GB optimiser state
    assert store._transfer(size).multipart_chunksize * 10_000 >= size
    assert store._transfer(MiB).multipart_chunksize == store.part_size
