"""How a stored trace document points at a blob, and why trace content never can.

The trace store keeps a long text out of its PostgreSQL row and leaves in its place

    {"$blob": "sha256:<64 hex>", "bytes": n, "preview": "..."}

Trace content is untrusted: an agent's output parsed as JSON, a verifier's details built from
sandbox events. A dict in it may well have a "$blob" key, and must come back as the same literal
data, never be taken for a reference (a forged one could make a read fetch any blob, or a path).
So store-made references are the only references:

- writing (`encode`) escapes every key made of "$"s and "blob" with one more "$" ("$blob" →
  "$$blob", "$$blob" → "$$$blob") before the store puts in its own references, and marks a
  document it escaped (`"$escaped": 1` at the top level, whose keys are the Trace's fields, never
  content);
- reading (`decode`) resolves only a dict that is exactly a store reference (these three keys, a
  reference `blobs.is_ref` accepts, an integer size, a string preview) and unescapes the keys of
  a marked document. A document written before escaping existed is unmarked: its keys are left
  as they are, and a "$blob" dict in it that is not exactly a reference is literal data.

Text PostgreSQL cannot hold goes the same way, whatever its length: jsonb refuses NUL (U+0000),
and no UTF-8 encoder takes a lone surrogate (half of a UTF-16 pair, which a JSON `\\ud800` escape
decodes to). A string holding either is stored as a blob (UTF-8, surrogates kept:
"surrogatepass") and reads back exactly; its preview shows them as U+FFFD. A dict *key* holding
either cannot be a reference, so it is stored with U+FFFD in their place (`storable_text`), as is
every column beside the document (ids, tags: text the engine refuses where it enters anyway).

Both walks are synchronous; the store fetches or puts the blobs they list concurrently.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conductor_engine.engine.storage.blobs import is_ref, ref_for

BLOB_KEY = "$blob"
ESCAPED = "$escaped"
PREVIEW_CHARS = 200
_REF_KEYS = frozenset((BLOB_KEY, "bytes", "preview"))
_ESCAPABLE = re.compile(r"\$+blob")  # fullmatch: "$blob", "$$blob", ...
_MARKER = b'$blob"'  # how any escapable key ends in JSON text
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # NUL, and surrogates (paired or not)
_NUL = b"\\u0000"  # how a NUL is serialised in JSON text


def storable_text(text: str) -> str:
    """`text` as PostgreSQL text can hold it, where it cannot be a blob (a column, a key, a
    preview): NUL and lone surrogates become U+FFFD, the replacement character, and a pair of
    surrogates written as two characters is joined into the one character it encodes."""
    if _UNSTORABLE.search(text) is None:
        return text
    text = text.replace("\x00", "\ufffd")
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def text_bytes(text: str) -> bytes:
    """What a text blob holds: `text` in UTF-8, any surrogate kept as its own three bytes."""
    return text.encode("utf-8", "surrogatepass")


def blob_text(data: bytes) -> str:
    """A text blob read back: the exact string `text_bytes` was given."""
    return data.decode("utf-8", "surrogatepass")


def may_hold_blob_keys(document_json: bytes) -> bool:
    """False when no key of this serialised document can need escaping (the common case, so
    a small trace is stored without walking it). A string that merely mentions `"$blob"` is
    serialised with escaped quotes and does not match; a false True only costs a walk."""
    return _MARKER in document_json


def may_hold_nul(document_json: bytes) -> bool:
    """False when no string of this serialised document holds a NUL (the common case). Text
    that merely spells a backslash and `u0000` matches too; a false True only costs a walk. (A
    lone surrogate never gets this far: the document cannot be serialised.)"""
    return _NUL in document_json


@dataclass
class Encoded:
    """A document ready for the row, and the blobs (reference → bytes) it now points to."""

    doc: dict[str, Any]
    blobs: dict[str, bytes] = field(default_factory=dict)
    escaped: bool = False


def encode(doc: dict[str, Any], *, threshold: int) -> Encoded:
    """`doc` with content keys escaped and made storable, and every text longer than
    `threshold` bytes or holding what PostgreSQL cannot store replaced by a reference (see the
    module docstring)."""
    out = Encoded(doc={})
    out.doc = _encode_dict(doc, threshold, out)
    if out.escaped:
        out.doc[ESCAPED] = 1
    return out


def _encode(value: Any, threshold: int, out: Encoded) -> Any:
    if isinstance(value, str):
        unstorable = _UNSTORABLE.search(value) is not None
        if unstorable or len(value) > threshold // 4:  # a cheap test first: UTF-8 <= 4x chars
            data = text_bytes(value)
            if len(data) > threshold or unstorable:
                ref = ref_for(data)
                out.blobs[ref] = data
                return {BLOB_KEY: ref, "bytes": len(data),
                        "preview": storable_text(value[:PREVIEW_CHARS])}
        return value
    if isinstance(value, dict):
        return _encode_dict(value, threshold, out)
    if isinstance(value, list):
        return [_encode(v, threshold, out) for v in value]
    return value


def _encode_dict(value: dict[str, Any], threshold: int, out: Encoded) -> dict[str, Any]:
    encoded: dict[str, Any] = {}
    for k, v in value.items():
        if _ESCAPABLE.fullmatch(k):
            k, out.escaped = "$" + k, True
        encoded[storable_text(k)] = _encode(v, threshold, out)
    return encoded


def is_blob_ref(value: Any) -> bool:
    """Whether `value` is exactly a reference the store wrote (see the module docstring)."""
    return (isinstance(value, dict) and value.keys() == _REF_KEYS and is_ref(value[BLOB_KEY])
            and type(value["bytes"]) is int and isinstance(value["preview"], str))


def refs_in(value: Any) -> set[str]:
    """The blob references in a stored document (what a read must fetch)."""
    found: set[str] = set()
    _collect(value, found)
    return found


def _collect(value: Any, found: set[str]) -> None:
    if isinstance(value, dict):
        if is_blob_ref(value):
            found.add(value[BLOB_KEY])
            return
        for v in value.values():
            _collect(v, found)
    elif isinstance(value, list):
        for v in value:
            _collect(v, found)


def decode(doc: dict[str, Any], texts: Mapping[str, str] | None) -> dict[str, Any]:
    """The document as it was before `encode`: references replaced by `texts` (reference →
    text; None leaves the references in place) and, in a marked document, keys unescaped."""
    doc = dict(doc)
    escaped = doc.pop(ESCAPED, None) == 1
    if not escaped and not texts:
        return doc
    return _decode_dict(doc, texts, escaped)


def _decode(value: Any, texts: Mapping[str, str] | None, escaped: bool) -> Any:
    if isinstance(value, dict):
        if is_blob_ref(value):
            return texts[value[BLOB_KEY]] if texts is not None else value
        return _decode_dict(value, texts, escaped)
    if isinstance(value, list):
        return [_decode(v, texts, escaped) for v in value]
    return value


def _decode_dict(value: dict[str, Any], texts: Mapping[str, str] | None,
                 escaped: bool) -> dict[str, Any]:
    return {(k[1:] if escaped and k.startswith("$$") and _ESCAPABLE.fullmatch(k) else k):
            _decode(v, texts, escaped) for k, v in value.items()}
