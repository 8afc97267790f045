"""Payloads encrypted with a key only their owner can read: Temporal's PayloadCodec, AES-256-GCM.

The embedded Temporal dev server listens on a loopback port with no credential (start-dev has
no TLS or authorization), so any local user could read a run's history through it: the task,
its reference answer, every agent's output. Encrypting every payload before it leaves the
process makes what the server holds ciphertext; the key lives in the private data directory
(0700, the key file 0600), so only its owner, and the codec endpoint (runtime/
codec_server.py) they reach, turns it back into text.

The scheme is the one Temporal's encryption sample uses, so the `temporal` CLI and the UI know
what they are looking at: a payload becomes `encoding: binary/encrypted` with the key's id in
`encryption-key-id`, its data a 12-byte random nonce followed by AES-GCM's ciphertext and tag of
the whole serialized payload (metadata included, so the inner encoding is hidden too).

- Decoding passes through every payload without that encoding: histories written before
  encryption was on (or by another user's plain client) still read.
- A payload encrypted with another key fails with a line naming both key ids, never as
  garbage.
- The key id is the first 8 bytes of the key's SHA-256: it tells keys apart and says nothing
  about the key.

The SDK applies the codec before external storage (engine/storage/payloads.py): an agent answer
large enough to go to the blob store is encrypted first, so the blob holds ciphertext and history
keeps only the SDK's reference to it (bucket, key, size, digest of the ciphertext).
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

import structlog
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

from conductor_engine.engine.storage.private import PRIVATE_FILE, private_dirs

log = structlog.get_logger("conductor.codec")

ENCODING = b"binary/encrypted"
KEY_ID = "encryption-key-id"
KEY_BYTES = 32  # AES-256
NONCE_BYTES = 12


class CodecError(RuntimeError):
    """A key that cannot be used or a payload that cannot be decrypted; the message says why
    and what to do."""


def key_id(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:16]


def read_key(path: Path) -> bytes:
    """The key in `path` (32 raw bytes). A key other users can read is still used (refusing
    would stop every run), but said loudly: it is no secret then."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise CodecError(
            f"the payload key {path} does not exist: create it once with 32 random bytes "
            f"(`head -c 32 /dev/urandom > {path} && chmod 600 {path}`) and give every worker "
            "and client the same file (payload_key_file)") from None
    except OSError as e:
        raise CodecError(f"cannot read the payload key {path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        key = f.read(KEY_BYTES + 1)
    if len(key) != KEY_BYTES:
        raise CodecError(f"the payload key {path} holds {len(key)} bytes, not {KEY_BYTES}: "
                         "it is not a key this engine wrote; restore the right file")
    if stat.S_IMODE(st.st_mode) & 0o077:
        log.warning("the payload key is readable by other users: whoever can read it can read "
                    "every run", path=str(path), mode=f"{stat.S_IMODE(st.st_mode):04o}")
    return key


def load_or_create_key(path: Path) -> bytes:
    """The key in `path`, created once (0600, its directory 0700) if there is none. Written
    whole to a temporary file and linked into place, so two processes starting together agree
    on one key and neither ever reads a half-written one."""
    if not path.exists():
        private_dirs(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".payload-key-")  # 0600
        try:
            os.fchmod(fd, PRIVATE_FILE)
            os.write(fd, os.urandom(KEY_BYTES))
            os.fsync(fd)
            os.close(fd)
            try:
                os.link(tmp, path)
                log.info("created the payload encryption key", path=str(path))
            except FileExistsError:
                pass  # another process made it first: use theirs
        finally:
            os.unlink(tmp)
    return read_key(path)


class EncryptionCodec(PayloadCodec):
    """AES-256-GCM over each whole payload (see the module's docstring for the format)."""

    def __init__(self, key: bytes) -> None:
        self.key_id = key_id(key)
        self._aead = AESGCM(key)

    def encrypt(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for p in payloads:
            nonce = os.urandom(NONCE_BYTES)
            data = nonce + self._aead.encrypt(nonce, p.SerializeToString(), None)
            out.append(Payload(metadata={"encoding": ENCODING, KEY_ID: self.key_id.encode()},
                               data=data))
        return out

    def decrypt(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for p in payloads:
            if p.metadata.get("encoding") != ENCODING:
                out.append(p)  # not ours: a plain payload from before encryption was on
                continue
            kid = p.metadata.get(KEY_ID, b"").decode(errors="replace")
            if kid != self.key_id:
                raise CodecError(
                    f"a payload was encrypted with key {kid!r}, this process has key "
                    f"{self.key_id!r}: give it the payload_key_file the run was written with")
            data = memoryview(p.data)  # no copy of a large payload's ciphertext
            try:
                plain = self._aead.decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], None)
            except InvalidTag:
                raise CodecError(f"a payload under key {kid!r} failed its integrity check: it "
                                 "was altered after it was written") from None
            out.append(Payload.FromString(plain))
        return out

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return self.encrypt(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return self.decrypt(payloads)
