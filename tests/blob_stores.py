"""The blob stores tests run against: a fresh bucket on S3 served by moto (the session fixture
`moto_url` in tests/conftest.py), with test credentials in the environment, and what a store,
local or S3, holds."""

from __future__ import annotations

import uuid

import boto3
import pytest

from conductor_engine.engine.storage.blobs import BlobStore, LocalBlobStore, S3BlobStore

AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


def fresh_bucket(endpoint_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new bucket on the S3 server at `endpoint_url`, with the test credentials (AWS_ENV) set
    in the environment for this test; its name."""
    for name, value in AWS_ENV.items():
        monkeypatch.setenv(name, value)
    bucket = f"conductor-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint_url).create_bucket(Bucket=bucket)
    return bucket


def stored_objects(store: BlobStore) -> list[str]:
    """Every object in the store, as keys (temporary files included, so leftovers show)."""
    if isinstance(store, LocalBlobStore):
        return sorted(str(p.relative_to(store.root)) for p in store.root.rglob("*") if p.is_file())
    assert isinstance(store, S3BlobStore)
    listing = store.client.list_objects_v2(Bucket=store.bucket)
    return sorted(o["Key"] for o in listing.get("Contents", []))
