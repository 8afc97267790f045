"""The blob store, local and on S3 (moto's real S3 wire-format server), and the Temporal
external-storage driver built on it, through a real data converter."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload

from conductor_engine.engine.contracts.records import RunResult
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.blobs import (
    BlobNotFound,
    BlobStore,
    BlobStoreError,
    LocalBlobStore,
    S3BlobStore,
    blob_store,
    ref_for,
)
from conductor_engine.engine.storage.payloads import KEY_PREFIX, data_converter
from tests.blob_stores import fresh_bucket, stored_objects
from tests.conftest import free_port


@pytest.fixture
def s3_settings(moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings for a fresh bucket on the moto server, with test credentials in the env."""
    bucket = fresh_bucket(moto_url, monkeypatch)
    return Settings(data_dir=tmp_path, s3_bucket=bucket, s3_endpoint_url=moto_url,
                    s3_prefix="runs/")


@pytest.fixture
def local_settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path)


@pytest.fixture(params=["local", "s3"])
def store_settings(request: pytest.FixtureRequest) -> Settings:
    return request.getfixturevalue(f"{request.param}_settings")  # type: ignore[no-any-return]


@pytest.fixture
def store(store_settings: Settings) -> BlobStore:
    return blob_store(store_settings)


# --- the content-addressed store ------------------------------------------------------------

def test_blob_store_follows_the_settings(local_settings: Settings, s3_settings: Settings) -> None:
    local = blob_store(local_settings)
    assert isinstance(local, LocalBlobStore) and local.root == local_settings.data_dir / "blobs"
    s3 = blob_store(s3_settings)
    assert isinstance(s3, S3BlobStore) and s3.bucket == s3_settings.s3_bucket
    assert s3.location == f"s3://{s3.bucket}/runs at {s3_settings.s3_endpoint_url}"


async def test_put_get_exists_round_trip(store: BlobStore) -> None:
    data = "an agent's long answer → ünïcode\n".encode() * 10_000
    ref = await store.put(data)
    assert ref == "sha256:" + hashlib.sha256(data).hexdigest()
    assert await store.exists(ref) and await store.get(ref) == data
    assert await store.put(data) == ref  # same bytes, same reference
    assert len(stored_objects(store)) == 1  # ... stored once
    assert not await store.exists(ref_for(b"something else"))


async def test_the_layout_fans_out_under_the_prefix(store: BlobStore) -> None:
    digest = (await store.put(b"x")).removeprefix("sha256:")
    prefix = "runs/" if isinstance(store, S3BlobStore) else ""
    assert stored_objects(store) == [f"{prefix}sha256/{digest[:2]}/{digest[2:]}"]


async def test_a_working_store_passes_its_check(store: BlobStore) -> None:
    await store.check()
    assert stored_objects(store) == []


async def test_an_unwritable_directory_says_what_to_set(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(BlobStoreError, match="CONDUCTOR_BLOB_DIR"):
        await LocalBlobStore(tmp_path / "file" / "blobs").check()


async def test_a_missing_blob_names_the_ref_and_the_store(store: BlobStore) -> None:
    ref = ref_for(b"never stored")
    with pytest.raises(BlobNotFound) as e:
        await store.get(ref)
    assert ref in str(e.value) and store.location in str(e.value)


async def test_concurrent_puts_of_the_same_bytes_store_one_blob(store: BlobStore) -> None:
    data = uuid.uuid4().bytes * 65_536  # 1 MiB
    refs = await asyncio.gather(*(store.put(data) for _ in range(16)))
    assert set(refs) == {ref_for(data)}
    assert await store.get(refs[0]) == data
    assert len(stored_objects(store)) == 1  # no duplicates, no temporary files left behind


async def test_concurrent_puts_of_the_same_bytes_write_once(store: BlobStore) -> None:
    writes: list[str] = []
    real_put_key = store.put_key

    async def counted_put_key(key: str, data: bytes) -> None:
        writes.append(key)
        await real_put_key(key, data)

    store.put_key = counted_put_key  # type: ignore[method-assign]
    data = uuid.uuid4().bytes * 4096
    await asyncio.gather(*(store.put(data) for _ in range(16)))
    assert len(writes) == 1
    await store.put(data)  # finished: the next put checks again and finds the blob there
    assert len(writes) == 1


async def test_a_cancelled_put_leaves_the_shared_upload_to_the_others(store: BlobStore) -> None:
    data = uuid.uuid4().bytes * 4096
    first = asyncio.ensure_future(store.put(data))
    second = asyncio.ensure_future(store.put(data))
    await asyncio.sleep(0)
    first.cancel()
    assert await second == ref_for(data)
    assert await store.get(ref_for(data)) == data
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_a_malformed_reference_is_refused(store: BlobStore) -> None:
    for ref in ("sha256:xyz", "md5:" + "0" * 32, "../../etc/passwd"):
        with pytest.raises(ValueError, match="not a blob reference"):
            await store.get(ref)


async def test_a_corrupt_local_blob_is_detected(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    ref = await store.put(b"the truth")
    (tmp_path / stored_objects(store)[0]).write_bytes(b"a lie")
    with pytest.raises(BlobStoreError, match="corrupt"):
        await store.get(ref)


async def test_local_keys_with_very_long_segments_still_work(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    key = "temporal/v0/wi/" + "%2F" * 300 + "/d/sha256/abc"  # a long, encoded workflow id
    await store.put_key(key, b"x")
    assert await store.exists_key(key) and await store.get_key(key) == b"x"


async def test_local_keys_cannot_leave_the_directory(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "blobs")
    for key in ("../outside", "/etc/passwd", "a//b", "a/./b", "a\\..\\b", ""):
        with pytest.raises(ValueError, match="invalid blob key"):
            await store.put_key(key, b"x")


# --- S3 misconfiguration: one clear message that says what to set ---------------------------

async def test_a_missing_bucket_says_so(s3_settings: Settings) -> None:
    store = blob_store(s3_settings.model_copy(update={"s3_bucket": "no-such-bucket"}))
    for attempt in (store.put(b"x"), store.get(ref_for(b"x")), store.exists(ref_for(b"x")),
                    store.check()):
        with pytest.raises(BlobStoreError) as e:
            await attempt
        assert not isinstance(e.value, BlobNotFound)
        assert "bucket 'no-such-bucket' does not exist" in str(e.value)
        assert "CONDUCTOR_S3_BUCKET" in str(e.value)


async def test_an_unreachable_endpoint_says_so(s3_settings: Settings) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    store = blob_store(s3_settings.model_copy(update={"s3_endpoint_url": url}))
    started = time.monotonic()
    with pytest.raises(BlobStoreError) as e:
        await store.put(b"x")
    assert time.monotonic() - started < 10
    assert url in str(e.value) and "CONDUCTOR_S3_ENDPOINT_URL" in str(e.value)


async def test_missing_credentials_say_so(
    s3_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                 "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    store = blob_store(s3_settings)
    with pytest.raises(BlobStoreError) as e:
        await store.check()
    assert "no AWS credentials found" in str(e.value) and "AWS_ACCESS_KEY_ID" in str(e.value)


# --- the Temporal external-storage driver ---------------------------------------------------

def is_reference(payload: Payload) -> bool:
    return payload.metadata.get("messageType") == b"temporal.api.sdk.v1.ExternalStorageReference"


async def test_large_payloads_go_to_the_store_and_come_back(store_settings: Settings) -> None:
    converter = data_converter(store_settings)
    big = RunResult(task_id="t", answer="x" * (2 * store_settings.payload_threshold))
    small = RunResult(task_id="t", answer="short")
    encoded = await converter.encode([big, small])
    assert is_reference(encoded[0]) and encoded[0].ByteSize() < 1024
    assert not is_reference(encoded[1])  # below the threshold it stays inline
    # another process with the same settings reads it back
    decoded = await data_converter(store_settings).decode(encoded, [RunResult, RunResult])
    assert decoded == [big, small]
    keys = stored_objects(blob_store(store_settings))
    assert len(keys) == 1 and KEY_PREFIX in keys[0]


async def test_a_process_with_other_blob_settings_says_so(
    local_settings: Settings, s3_settings: Settings
) -> None:
    encoded = await data_converter(local_settings).encode(["y" * 300_000])
    with pytest.raises(RuntimeError) as e:
        await data_converter(s3_settings).decode(encoded, [str])
    assert "same CONDUCTOR_S3_BUCKET" in str(e.value.__cause__)


async def test_a_lost_payload_blob_names_its_key(local_settings: Settings) -> None:
    encoded = await data_converter(local_settings).encode(["z" * 300_000])
    for path in local_settings.blobs_path.rglob("*"):
        if path.is_file():
            path.unlink()
    with pytest.raises(RuntimeError) as e:
        await data_converter(local_settings).decode(encoded, [str])
    assert isinstance(e.value.__cause__, BlobNotFound)
    assert str(local_settings.blobs_path) in str(e.value.__cause__)
