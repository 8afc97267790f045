"""The payload codec (engine/storage/codec.py) and how the data converter uses it: a key made
once, private, and refused when it is not a key; ciphertext that carries no plaintext, cannot be
altered unnoticed and names the key it needs; plain payloads from before encryption pass; large
payloads reach the blob store already encrypted; failure messages are redacted, then encrypted;
the codec endpoint knows who is calling."""

from __future__ import annotations

import os
import socket
import stat
import threading
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.failure.v1 import Failure
from temporalio.exceptions import ApplicationError

from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.codec import (
    ENCODING,
    CodecError,
    EncryptionCodec,
    load_or_create_key,
    read_key,
)
from conductor_engine.engine.storage.payloads import data_converter
from conductor_engine.runtime.codec_server import peer_uid

SECRET = "the reference answer is 42"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_key_is_made_once_private_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "data" / "payload.key"
    key = load_or_create_key(path)
    assert len(key) == 32 and _mode(path) == 0o600 and _mode(path.parent) == 0o700
    assert load_or_create_key(path) == key and read_key(path) == key
    assert [p.name for p in path.parent.iterdir()] == ["payload.key"], "no temporary file left"


def test_processes_racing_to_make_the_key_agree_on_one(tmp_path: Path) -> None:
    path = tmp_path / "payload.key"
    keys: list[bytes] = []
    threads = [threading.Thread(target=lambda: keys.append(load_or_create_key(path)))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(keys)) == 1 and len(keys) == 8


def test_a_file_that_is_no_key_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "payload.key"
    path.write_bytes(b"short")
    with pytest.raises(CodecError, match="holds 5 bytes, not 32"):
        read_key(path)
    with pytest.raises(CodecError, match=r"does not exist: create it once"):
        read_key(tmp_path / "missing.key")


def test_a_cluster_never_makes_a_key_of_its_own(tmp_path: Path) -> None:
    """A key made on one host would leave the others unable to read its payloads."""
    settings = Settings(temporal_address="temporal.example:7233", data_dir=tmp_path,
                        payload_key_file=tmp_path / "shared.key")
    assert settings.encrypts_payloads
    with pytest.raises(CodecError, match="every worker and client the same file"):
        data_converter(settings)
    assert not (tmp_path / "shared.key").exists()


def test_encryption_is_on_for_the_embedded_stack_and_asked_for_on_a_cluster(
    tmp_path: Path,
) -> None:
    assert Settings(data_dir=tmp_path).encrypts_payloads
    assert not Settings(data_dir=tmp_path, payload_encryption=False).encrypts_payloads
    cluster = Settings(data_dir=tmp_path, temporal_address="t:7233")
    assert not cluster.encrypts_payloads
    assert data_converter(cluster).payload_codec is None


async def test_payloads_are_ciphertext_that_decodes_back(tmp_path: Path) -> None:
    converter = data_converter(Settings(data_dir=tmp_path))
    [payload] = await converter.encode([SECRET])
    assert payload.metadata["encoding"] == ENCODING
    assert SECRET.encode() not in payload.SerializeToString()
    assert b"json/plain" not in payload.SerializeToString(), "the inner encoding is hidden too"
    assert await converter.decode([payload], [str]) == [SECRET]
    [again] = await converter.encode([SECRET])
    assert again.data != payload.data, "a fresh nonce per payload"


async def test_plain_payloads_from_before_encryption_pass_through(tmp_path: Path) -> None:
    plain = data_converter(Settings(data_dir=tmp_path, payload_encryption=False))
    encrypted = data_converter(Settings(data_dir=tmp_path))
    assert await encrypted.decode(await plain.encode([SECRET]), [str]) == [SECRET]


async def test_a_payload_under_another_key_or_altered_is_refused_by_name(tmp_path: Path) -> None:
    mine, theirs = EncryptionCodec(os.urandom(32)), EncryptionCodec(os.urandom(32))
    [payload] = await theirs.encode([Payload(data=SECRET.encode())])
    with pytest.raises(CodecError, match=f"encrypted with key '{theirs.key_id}'.*"
                                         f"has key '{mine.key_id}'"):
        await mine.decode([payload])
    [payload] = await mine.encode([Payload(data=SECRET.encode())])
    payload.data = payload.data[:-1] + bytes([payload.data[-1] ^ 1])
    with pytest.raises(CodecError, match="failed its integrity check"):
        await mine.decode([payload])


async def test_a_large_payload_reaches_the_blob_store_encrypted(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, payload_threshold=1024)
    converter = data_converter(settings)
    big = SECRET * 1000
    [reference] = await converter.encode([big])
    assert SECRET.encode() not in reference.SerializeToString()
    blobs = [p for p in settings.blobs_path.rglob("*") if p.is_file()]
    assert blobs and all(SECRET.encode() not in p.read_bytes() for p in blobs)
    assert await converter.decode([reference], [str]) == [big]


async def test_failure_messages_are_redacted_then_encrypted(tmp_path: Path) -> None:
    converter = data_converter(Settings(data_dir=tmp_path))
    try:
        try:
            raise ValueError(f"input was {SECRET!r}; password=hunter2")
        except ValueError as e:
            raise ApplicationError(f"step failed on {SECRET!r}") from e
    except ApplicationError as e:
        failure = Failure()
        await converter.encode_failure(e, failure)
    written = failure.SerializeToString()
    assert SECRET.encode() not in written and b"hunter2" not in written
    assert failure.message == "Encoded failure" and failure.cause.message == "Encoded failure"
    decoded = await converter.decode_failure(failure)
    assert str(decoded) == f"step failed on {SECRET!r}"
    assert SECRET in str(decoded.__cause__) and "hunter2" not in str(decoded.__cause__)


def test_the_codec_endpoint_reads_the_uid_of_a_loopback_peer() -> None:
    if not Path("/proc/net/tcp").exists():
        pytest.skip("no /proc/net/tcp on this system: the peer's uid cannot be read")
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        conn, _ = server.accept()
        with client, conn:
            assert peer_uid(conn) == os.geteuid()
