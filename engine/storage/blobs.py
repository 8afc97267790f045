"""Content-addressed blob storage: a local directory by default, S3 (or MinIO) when configured.

Traces keep large texts here and record only a reference, `sha256:<hex>`; the same bytes always
give the same reference and are stored once, so a retried activity or a duplicated output costs
nothing extra. The key-level methods (`put_key`, `get_key`, `exists_key`) exist for the Temporal
external-storage driver (engine/storage/payloads.py), which chooses its own keys.

Checkpoints and optimiser states go through `put_file`/`get_to_file` instead: a 7B full fine-tune's
optimiser state is ~56 GB, so those stream in chunks (local: a temporary file renamed into place;
S3: multipart) and are hashed as they go, never held whole. The same bytes get the same reference
either way (docs/how-to/checkpoints.md).

Layout, under the directory or under `s3://bucket/prefix/`:
    sha256/ab/cdef...            trace blobs, fanned out so no directory grows huge
    temporal/v0/...              Temporal payloads (keys chosen by the SDK's S3 driver)
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.private import private_dirs

REF_ALGORITHM = "sha256"
T = TypeVar("T")
_MAX_NAME = 200  # bytes per file name; most file systems allow 255
IO_CHUNK = 4 * 1024 * 1024
"""Bytes read at a time when hashing or copying a file: memory use while streaming."""
PART_SIZE = 8 * 1024 * 1024
"""S3 multipart part size (S3's minimum is 5 MiB): files above it are uploaded in parts."""
_MAX_PARTS = 9_000  # S3 allows 10,000 parts per upload; a margin for rounding
_REF = re.compile(r"sha256:([0-9a-f]{64})")  # always fullmatch: `$` would allow a newline

_S3_HINT = (
    "set CONDUCTOR_S3_BUCKET to an existing bucket, CONDUCTOR_S3_ENDPOINT_URL for MinIO or "
    "another S3-compatible server (e.g. http://localhost:9000), CONDUCTOR_S3_REGION if needed, "
    "and AWS credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE); or unset "
    "CONDUCTOR_S3_BUCKET to keep blobs in the local directory (CONDUCTOR_BLOB_DIR)"
)


class BlobStoreError(RuntimeError):
    """The store cannot be used (unreachable, misconfigured, corrupt); the message says why."""


class BlobNotFound(BlobStoreError, LookupError):
    """No blob under that reference or key; the message names it and the store's location."""


class BlobCorrupt(BlobStoreError):
    """The blob's bytes do not hash to its reference."""


def is_ref(value: object) -> bool:
    """Whether `value` is exactly what `put` returns: 'sha256:' and 64 lowercase hex digits."""
    return isinstance(value, str) and _REF.fullmatch(value) is not None


def checked_key(key: str) -> str:
    """`key` if it can only ever name an object under the store's root, else ValueError.

    Keys reach a file path (local) or an S3 object key, and some come from outside this
    process (Temporal history, trace documents), so none may be absolute, climb (`..`), hold
    empty or `.` segments, a backslash, or a control character (NUL ends a C string)."""
    if (not key or "\\" in key or any(ord(c) < 32 or ord(c) == 127 for c in key)
            or any(part in ("", ".", "..") for part in key.split("/"))):
        raise ValueError(f"invalid blob key {key!r}")
    return key


def ref_for(data: bytes) -> str:
    """The content address of `data`: what `put` returns for it."""
    return f"{REF_ALGORITHM}:{hashlib.sha256(data).hexdigest()}"


def file_ref(path: Path) -> str:
    """The content address of the file at `path`, read in chunks: what `put` returns for its
    bytes, without holding them."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        _copy(f, None, digest)
    return f"{REF_ALGORITHM}:{digest.hexdigest()}"


def _copy(src: Any, dst: Any, digest: Any) -> None:
    """Read `src` to its end through one reused buffer, hashing into `digest` and writing to
    `dst` (if any): memory stays at IO_CHUNK whatever the size."""
    buf = bytearray(IO_CHUNK)
    view = memoryview(buf)
    while n := src.readinto(buf):
        digest.update(view[:n])
        if dst is not None:
            dst.write(view[:n])


def key_for(ref: str) -> str:
    """The storage key of a reference: `sha256/ab/cdef...` (two-character fan-out)."""
    match = _REF.fullmatch(ref) if isinstance(ref, str) else None
    if match is None:
        raise ValueError(f"not a blob reference: {ref!r} (expected 'sha256:' and 64 hex digits)")
    digest = match.group(1)
    return f"{REF_ALGORITHM}/{digest[:2]}/{digest[2:]}"


def _forget(in_flight: dict[Any, Any], slot: Any, done: asyncio.Future[None]) -> None:
    """Drop a finished shared upload, reading its outcome so an error every waiter already
    received (or none was left to receive) is not also logged as never retrieved."""
    in_flight.pop(slot, None)
    if not done.cancelled():
        done.exception()


class BlobStore(ABC):
    """Content-addressed `put`/`get`/`exists` over a key-value backend.

    Subclasses implement the three key-level methods and `location`; the content addressing,
    deduplication and integrity check live here once.
    """

    @property
    @abstractmethod
    def location(self) -> str:
        """Where blobs live, for error messages: a directory or an s3:// URL."""

    @abstractmethod
    async def put_key(self, key: str, data: bytes) -> None:
        """Store `data` under `key`, replacing any earlier object atomically."""

    @abstractmethod
    async def get_key(self, key: str) -> bytes:
        """The bytes under `key`; BlobNotFound if there are none."""

    @abstractmethod
    async def exists_key(self, key: str) -> bool:
        """Whether an object exists under `key`."""

    @abstractmethod
    async def check(self) -> None:
        """Fail now, with a message saying what to set, if the store cannot be used; cheap
        enough to call when a worker or the CLI starts."""

    @abstractmethod
    async def delete_key(self, key: str) -> None:
        """Remove the object under `key`; nothing happens if there is none."""

    @abstractmethod
    async def size_key(self, key: str) -> int | None:
        """The size in bytes of the object under `key`, None if there is none."""

    @abstractmethod
    async def put_file(self, path: Path) -> str:
        """Store the file at `path` once and return its reference, streaming: the same
        reference `put(path.read_bytes())` would return, without reading the file into
        memory."""

    @abstractmethod
    async def get_to_file(self, ref: str, path: Path) -> None:
        """Write the blob `ref` to `path` (replaced atomically), streaming, checked against
        its hash: BlobNotFound if there is none, BlobCorrupt (and `path` untouched) if its
        bytes do not hash to `ref`."""

    async def delete(self, ref: str) -> None:
        """Remove the blob `ref`. Only retention (engine/storage/retention.py) calls this, after
        checking that nothing kept references it: blobs are shared by content."""
        await self.delete_key(key_for(ref))

    async def size(self, ref: str) -> int | None:
        return await self.size_key(key_for(ref))

    async def put(self, data: bytes) -> str:
        """Store `data` once and return its reference; existing content is not rewritten.

        Concurrent puts of the same bytes on one event loop share one upload (a batch's runs
        often write the same prompt at once): one existence check and one write, not sixteen
        racing writes of one key, which some S3 servers answer with a 500. A caller that is
        cancelled leaves the shared upload running for the others."""
        ref = ref_for(data)
        in_flight: dict[tuple[int, str], asyncio.Future[None]] = self.__dict__.setdefault(
            "_puts_in_flight", {})
        slot = (id(asyncio.get_running_loop()), ref)
        upload = in_flight.get(slot)
        if upload is None:
            upload = in_flight[slot] = asyncio.ensure_future(self._put_once(key_for(ref), data))
            upload.add_done_callback(lambda done: _forget(in_flight, slot, done))
        await asyncio.shield(upload)
        return ref

    async def _put_once(self, key: str, data: bytes) -> None:
        if not await self.exists_key(key):
            await self.put_key(key, data)

    async def get(self, ref: str) -> bytes:
        """The bytes of `ref`, checked against their hash so corruption never goes unnoticed."""
        try:
            data = await self.get_key(key_for(ref))
        except BlobNotFound as e:
            raise BlobNotFound(f"blob {ref} not found in {self.location}") from e
        if ref_for(data) != ref:
            raise BlobCorrupt(f"blob {ref} in {self.location} is corrupt: its content hashes "
                              f"to {ref_for(data)}")
        return data

    async def exists(self, ref: str) -> bool:
        return await self.exists_key(key_for(ref))


class LocalBlobStore(BlobStore):
    """Blobs as files under a directory. Writes go to a temporary file in the target directory
    and are renamed into place, so a reader (or a crash) never sees half a blob and concurrent
    writers of the same bytes cannot interfere."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @property
    def location(self) -> str:
        return f"directory {self.root.resolve()}"

    def path(self, key: str) -> Path:
        """The file for `key`. Keys come from history and traces, so one that could leave the
        directory is refused rather than trusted (`checked_key`)."""
        return self.root.joinpath(*map(_file_name, checked_key(key).split("/")))

    async def put_key(self, key: str, data: bytes) -> None:
        await asyncio.to_thread(_write_atomic, self.path(key), data)

    async def get_key(self, key: str) -> bytes:
        path = self.path(key)
        try:
            return await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            raise BlobNotFound(f"blob key {key!r} not found in {self.location}") from None

    async def exists_key(self, key: str) -> bool:
        return await asyncio.to_thread(self.path(key).is_file)

    async def delete_key(self, key: str) -> None:
        await asyncio.to_thread(self.path(key).unlink, missing_ok=True)

    async def size_key(self, key: str) -> int | None:
        try:
            return (await asyncio.to_thread(self.path(key).stat)).st_size
        except FileNotFoundError:
            return None

    async def put_file(self, path: Path) -> str:
        return await asyncio.to_thread(self._put_file, Path(path))

    def _put_file(self, src: Path) -> str:
        """One pass: copy into a temporary file beside the blobs while hashing, then rename it
        to the address the hash gives (or drop it when that blob exists already)."""
        staging = self.root / REF_ALGORITHM
        staging.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=staging, prefix=".tmp-")
        digest = hashlib.sha256()
        try:
            with open(src, "rb") as f, os.fdopen(fd, "wb") as out:
                _copy(f, out, digest)
                out.flush()
                os.fsync(out.fileno())
            ref = f"{REF_ALGORITHM}:{digest.hexdigest()}"
            target = self.path(key_for(ref))
            if target.is_file():
                Path(tmp).unlink()
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp, target)
            return ref
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    async def get_to_file(self, ref: str, path: Path) -> None:
        source = self.path(key_for(ref))
        try:
            await asyncio.to_thread(_checked_copy, ref, source, Path(path), self.location)
        except FileNotFoundError:
            if not source.is_file():
                raise BlobNotFound(f"blob {ref} not found in {self.location}") from None
            raise

    async def check(self) -> None:
        probe = self.root / ".check"
        try:
            await asyncio.to_thread(_write_atomic, probe, b"ok")
            await asyncio.to_thread(probe.unlink)
        except OSError as e:
            raise BlobStoreError(f"cannot write blobs to {self.location}: {e}; set "
                                 "CONDUCTOR_BLOB_DIR (or CONDUCTOR_DATA_DIR) to a writable "
                                 "directory, or CONDUCTOR_S3_BUCKET to use S3") from e


def _file_name(segment: str) -> str:
    """A key segment as a file name. S3 keys may hold 1,024 bytes in one segment (a long,
    percent-encoded workflow id) but file names stop at 255, so a long segment is shortened to
    a prefix plus its hash: deterministic, so reads find what writes wrote."""
    if len(segment.encode()) <= _MAX_NAME:
        return segment
    return f"{segment[:64]}~{hashlib.sha256(segment.encode()).hexdigest()}"


def _checked_copy(ref: str, source: Path, target: Path, location: str) -> None:
    """Copy `source` to a temporary file beside `target` while hashing, and rename it into
    place only when the hash is `ref`."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.tmp-")
    digest = hashlib.sha256()
    try:
        with open(source, "rb") as f, os.fdopen(fd, "wb") as out:
            _copy(f, out, digest)
        _verify(ref, digest.hexdigest(), location)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _verify(ref: str, hexdigest: str, location: str) -> None:
    got = f"{REF_ALGORITHM}:{hexdigest}"
    if got != ref:
        raise BlobCorrupt(f"blob {ref} in {location} is corrupt: its content hashes to {got}")


def _write_atomic(path: Path, data: bytes) -> None:
    """Write through a unique temporary file, fsync it, then rename it over `path`: the blob is
    on disk before any reference to it is recorded. Private, as the data directory is
    (engine/storage/private.py): the file 0600 (mkstemp's mode), directories 0700 when new."""
    private_dirs(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class S3BlobStore(BlobStore):
    """Blobs as objects in an S3 bucket (AWS, MinIO or any S3-compatible server) under a prefix.

    boto3 is synchronous; its client is thread-safe, so each call runs in a worker thread and
    the event loop (a Temporal worker's) keeps running. Every botocore failure is turned into
    one BlobStoreError that says what to set.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        client: Any = None,
        part_size: int = PART_SIZE,
        max_concurrency: int = 4,
    ) -> None:
        self.bucket = bucket
        self.prefix = "/".join(p for p in prefix.split("/") if p)
        self.endpoint_url = endpoint_url
        self.client = client or _boto3_client(endpoint_url, region)
        self.part_size = part_size
        self.max_concurrency = max_concurrency

    @property
    def location(self) -> str:
        where = f"s3://{self.bucket}/{self.prefix}"
        return f"{where} at {self.endpoint_url}" if self.endpoint_url else where

    def object_key(self, key: str) -> str:
        """The S3 key under the prefix; `checked_key` refuses any key that could climb out of
        it on a server that normalises paths."""
        key = checked_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    async def put_key(self, key: str, data: bytes) -> None:
        obj = self.object_key(key)  # an invalid key is a ValueError, not an S3 problem

        def put() -> None:
            self.client.put_object(Bucket=self.bucket, Key=obj, Body=data)

        await self._run(put, key)

    async def get_key(self, key: str) -> bytes:
        obj = self.object_key(key)

        def get() -> bytes:
            response = self.client.get_object(Bucket=self.bucket, Key=obj)
            return bytes(response["Body"].read())

        return await self._run(get, key)

    async def exists_key(self, key: str) -> bool:
        obj = self.object_key(key)

        def head() -> None:
            self.client.head_object(Bucket=self.bucket, Key=obj)

        try:
            await self._run(head, key)
        except BlobNotFound:
            return False
        return True

    async def check(self) -> None:
        await self._run(lambda: self.client.head_bucket(Bucket=self.bucket), None)

    async def delete_key(self, key: str) -> None:
        obj = self.object_key(key)
        await self._run(lambda: self.client.delete_object(Bucket=self.bucket, Key=obj), key)

    async def size_key(self, key: str) -> int | None:
        obj = self.object_key(key)

        def head() -> int:
            return int(self.client.head_object(Bucket=self.bucket, Key=obj)["ContentLength"])

        try:
            return await self._run(head, key)
        except BlobNotFound:
            return None

    def _transfer(self, size: int = 0) -> Any:
        """Multipart above one part, `max_concurrency` parts in flight: memory stays near
        part size × max_concurrency whatever the file's size. S3 allows 10,000 parts, so a
        file above part_size × 9,000 (72 GB at 8 MiB) gets larger parts."""
        from boto3.s3.transfer import TransferConfig

        part = max(self.part_size, -(-size // _MAX_PARTS))
        return TransferConfig(multipart_threshold=self.part_size, multipart_chunksize=part,
                              max_concurrency=self.max_concurrency)

    async def put_file(self, path: Path) -> str:
        """Hash in chunks, then (unless the blob exists) upload with boto3's managed transfer,
        which reads the file part by part."""
        ref = await asyncio.to_thread(file_ref, Path(path))
        key = key_for(ref)
        if not await self.exists_key(key):
            obj = self.object_key(key)
            config = self._transfer(Path(path).stat().st_size)
            await self._run(lambda: self.client.upload_file(
                str(path), self.bucket, obj, Config=config), key)
        return ref

    async def get_to_file(self, ref: str, path: Path) -> None:
        """Download to a temporary file beside `path` (ranged GETs, part by part), check its
        hash, rename it into place."""
        key = key_for(ref)
        obj = self.object_key(key)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.tmp-")
        os.close(fd)
        try:
            try:
                await self._run(lambda: self.client.download_file(
                    self.bucket, obj, tmp, Config=self._transfer()), key)
            except BlobNotFound:
                raise BlobNotFound(f"blob {ref} not found in {self.location}") from None
            _verify(ref, (await asyncio.to_thread(file_ref, Path(tmp))).split(":")[1],
                    self.location)
            os.replace(tmp, target)
        finally:
            Path(tmp).unlink(missing_ok=True)

    async def _run(self, call: Callable[[], T], key: str | None) -> T:
        """Run one boto3 call in a thread, its failures translated there (see `_s3_error`)."""
        return await asyncio.to_thread(self._translated, call, key)

    def _translated(self, call: Callable[[], T], key: str | None) -> T:
        try:
            return call()
        except Exception as e:
            raise self._s3_error(e, key) from e

    def _s3_error(self, error: Exception, key: str | None) -> BlobStoreError:
        """A missing object becomes BlobNotFound; anything else a BlobStoreError naming the
        problem and the settings that fix it. A HEAD of a key in a missing bucket answers a
        bare 404, so a bare 404 is only taken for a missing object when the bucket answers."""
        from botocore.exceptions import (
            ClientError,
            EndpointConnectionError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        problem = f"{type(error).__name__}: {error}"
        if isinstance(error, ClientError):
            code = str(error.response.get("Error", {}).get("Code", ""))
            if key is not None and (code == "NoSuchKey"
                                    or code in ("404", "NotFound") and self._bucket_exists()):
                return BlobNotFound(f"blob key {key!r} not found in {self.location}")
            if code in ("NoSuchBucket", "404", "NotFound"):
                problem = f"bucket {self.bucket!r} does not exist"
            elif code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                problem = f"access denied ({code}): check the AWS credentials and their rights"
        elif isinstance(error, NoCredentialsError | PartialCredentialsError):
            problem = "no AWS credentials found"
        elif isinstance(error, EndpointConnectionError):
            problem = str(error)
        return BlobStoreError(f"S3 blob store {self.location}: {problem}. To fix it, {_S3_HINT}")

    def _bucket_exists(self) -> bool:
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except Exception:
            return False
        return True


def _boto3_client(endpoint_url: str | None, region: str | None) -> Any:
    """An S3 client with short connect timeouts and few retries, so a wrong endpoint fails in
    seconds (Temporal retries the activity or workflow task that needed the blob). It gets a
    session of its own: boto3's default session is process-wide and caches credentials."""
    import boto3
    from botocore.config import Config

    config = Config(connect_timeout=5, read_timeout=60,
                    retries={"max_attempts": 3, "mode": "standard"})
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint_url, region_name=region, config=config
    )


def blob_store(settings: Settings) -> BlobStore:
    """S3 when `s3_bucket` is set, else the local directory `blobs_path`. No I/O happens here;
    call `check()` to find a bad configuration before the first blob is needed."""
    if settings.s3_bucket:
        return S3BlobStore(settings.s3_bucket, settings.s3_prefix,
                           endpoint_url=settings.s3_endpoint_url, region=settings.s3_region)
    return LocalBlobStore(settings.blobs_path)
