"""The data converter every client, worker and replayer uses: pydantic plus external storage.

Temporal refuses any payload over 2 MB (and warns from 512 KB), and a whole workflow task's
commands must fit in a 4 MB gRPC message. An agent can answer with more than that, and its
answer travels as an activity result, then inside the next step's input and the run's result.
So every payload of at least `settings.payload_threshold` bytes (256 KiB by default) is written
to the blob store (engine/storage/blobs.py) and history keeps only a small reference to it.

One driver covers both back ends: the SDK's own `S3StorageDriver` (content-addressed keys,
SHA-256 integrity check on read, a 50 MiB cap per payload, error context) over
`BlobStoreDriverClient`, a small adapter to our `BlobStore`. With S3 configured that is boto3
against the bucket; in the embedded default it is a local directory (`blobs_path/temporal/...`).
Reusing the driver rather than writing a second one for local files keeps one key scheme and
one integrity check, both the SDK's and tested there.

Only the SDK makes a payload a reference: it marks it in the payload's metadata (encoding),
which no content can set, so an agent's output that looks like a reference stays data. The key in
a reference comes back from history, so `BlobStoreDriverClient` accepts only keys shaped as the
driver writes them (percent-encoded segments), and the blob store refuses any key that could
leave its root (`checked_key`).

Every worker, client and replayer of a namespace must use the same blob settings
(CONDUCTOR_S3_BUCKET, CONDUCTOR_S3_PREFIX, CONDUCTOR_S3_ENDPOINT_URL, or the same
CONDUCTOR_BLOB_DIR on a shared disk): a payload written by one process is read back by another,
and a history is only readable while its blobs are. The reference names the bucket ("local" for
a directory); a process configured for a different one says so instead of guessing.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from temporalio.api.failure.v1 import Failure
from temporalio.contrib.aws.s3driver import S3StorageDriver, S3StorageDriverClient
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import (
    DataConverter,
    DefaultFailureConverter,
    ExternalStorage,
    PayloadConverter,
)

from conductor_engine.engine.redaction import redact_text
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.blobs import BlobStore, BlobStoreError, blob_store
from conductor_engine.engine.storage.codec import EncryptionCodec, load_or_create_key, read_key

DRIVER_NAME = "conductor.blobs"
LOCAL_BUCKET = "local"
KEY_PREFIX = "temporal/"
# The SDK driver's keys: segments percent-encoded to S3's safe characters, joined by "/".
_DRIVER_KEY = re.compile(r"[A-Za-z0-9!\-_.*'()%]+(/[A-Za-z0-9!\-_.*'()%]+)*")
# "." is safe to the SDK, so a workflow id "." or ".." stays a segment that is a path step;
# "%2E" is not one the SDK writes (it encodes "%" as "%25"), so the mapping is one to one.
_DOT_SEGMENTS = {".": "%2E", "..": "%2E%2E"}


class BlobStoreDriverClient(S3StorageDriverClient):
    """Lets the SDK's S3 driver keep payloads in any BlobStore, under `temporal/<key>`."""

    def __init__(self, store: BlobStore, bucket: str) -> None:
        self.store, self.bucket = store, bucket

    async def put_object(self, *, bucket: str, key: str, data: bytes) -> None:
        await self.store.put_key(self._key(bucket, key), data)

    async def object_exists(self, *, bucket: str, key: str) -> bool:
        return await self.store.exists_key(self._key(bucket, key))

    async def get_object(self, *, bucket: str, key: str) -> bytes:
        return await self.store.get_key(self._key(bucket, key))

    def describe(self) -> Mapping[str, str]:
        return {"store": self.store.location}

    def _key(self, bucket: str, key: str) -> str:
        if bucket != self.bucket:
            raise BlobStoreError(
                f"this payload was stored in bucket {bucket!r}, but this process keeps blobs in "
                f"{self.store.location}: every worker and client must use the same "
                "CONDUCTOR_S3_BUCKET / CONDUCTOR_BLOB_DIR settings")
        if _DRIVER_KEY.fullmatch(key) is None:
            raise BlobStoreError(f"payload key {key!r} is not one the storage driver writes; "
                                 "the reference in this history was not made by this engine")
        return KEY_PREFIX + "/".join(_DOT_SEGMENTS.get(p, p) for p in key.split("/"))


def storage_driver(settings: Settings, store: BlobStore | None = None) -> S3StorageDriver:
    """The driver over `store` (by default the configured blob store)."""
    client = BlobStoreDriverClient(store or blob_store(settings),
                                   settings.s3_bucket or LOCAL_BUCKET)
    return S3StorageDriver(client, client.bucket, driver_name=DRIVER_NAME)


class RedactingFailureConverter(DefaultFailureConverter):
    """Every failure written to a history without a secret in it: the message and stack trace
    of the error and of each of its causes go through `redact_text`. An error raised anywhere
    below an activity (a driver quoting its connection string, an SDK quoting a URL with a
    password in it) reaches history only through here, so this is the one place that cannot be
    bypassed by a call site that forgot."""

    encrypted = False

    def to_failure(self, exception: BaseException, payload_converter: PayloadConverter,
                   failure: Failure) -> None:
        super().to_failure(exception, payload_converter, failure)
        current: Failure | None = failure
        while current is not None:
            current.message = redact_text(current.message)
            if current.stack_trace:
                current.stack_trace = redact_text(current.stack_trace)
            current = current.cause if current.HasField("cause") else None
        if self.encrypted and not failure.HasField("encoded_attributes"):
            # As DefaultFailureConverter(encode_common_attributes=True) does, but after the
            # redaction: the message and stack trace move into a payload the codec encrypts
            # (each cause is converted through here too). A message can quote run data (a
            # provider's error quoting the prompt, a validation error quoting its input).
            failure.encoded_attributes.CopyFrom(payload_converter.to_payloads(
                [{"message": failure.message, "stack_trace": failure.stack_trace}])[0])
            failure.message, failure.stack_trace = "Encoded failure", ""


class EncryptedFailureConverter(RedactingFailureConverter):
    """Redacted, and its message and stack trace encrypted with the payloads."""

    encrypted = True


def payload_codec(settings: Settings) -> EncryptionCodec | None:
    """The codec that encrypts payloads (engine/storage/codec.py), or None when
    `settings.encrypts_payloads` is off. The embedded stack creates its key on first use; on a
    cluster the key must already exist: a key made on one host would make every other host's
    payloads unreadable."""
    if not settings.encrypts_payloads:
        return None
    path = settings.payload_key_path
    return EncryptionCodec(load_or_create_key(path) if settings.embedded else read_key(path))


def data_converter(settings: Settings, store: BlobStore | None = None) -> DataConverter:
    """The pydantic data converter with payloads encrypted (when `encrypts_payloads`), those of
    `payload_threshold` bytes or more then kept in the blob store, and failures redacted of
    secrets (and encrypted). Give the same settings to every client, worker and Replayer.

    The SDK orders the two: the codec runs first on every payload, then external storage takes
    the large ones, so a blob holds ciphertext and history holds only its reference; reading
    back fetches the blob, then decrypts."""
    storage = ExternalStorage(drivers=[storage_driver(settings, store)],
                              payload_size_threshold=settings.payload_threshold)
    codec = payload_codec(settings)
    return dataclasses.replace(
        pydantic_data_converter, external_storage=storage, payload_codec=codec,
        failure_converter_class=(EncryptedFailureConverter if codec is not None
                                 else RedactingFailureConverter))
