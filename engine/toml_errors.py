"""One-line messages for files people write by hand in TOML (pool files, conductor.toml)."""

from __future__ import annotations

import codecs
import re
import tomllib

_AT = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")


def toml_error(path: object, error: tomllib.TOMLDecodeError) -> str:
    """`PATH:LINE:COLUMN: invalid TOML: what`, the form editors jump to (Python 3.11's
    TOMLDecodeError keeps the position only in its message)."""
    text = str(error)
    found = _AT.search(text)
    if found is None:
        return f"{path}: invalid TOML: {text}"
    return f"{path}:{found.group(1)}:{found.group(2)}: invalid TOML: {text[:found.start()]}"


def not_utf8(path: object, error: UnicodeDecodeError) -> str:
    """`PATH: not UTF-8 (why) at byte N; save it as UTF-8`."""
    return f"{path}: not UTF-8 ({error.reason}) at byte {error.start}; save it as UTF-8"


def utf8_text(raw: bytes) -> str:
    """A hand-written file's bytes as text: UTF-8, a leading byte order mark skipped (editors on
    Windows write one, and TOML would call it an invalid statement). Raises UnicodeDecodeError
    with offsets into `raw`, BOM counted, for `not_utf8`."""
    skip = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0
    try:
        return raw[skip:].decode("utf-8")
    except UnicodeDecodeError as e:
        raise UnicodeDecodeError(e.encoding, raw, e.start + skip, e.end + skip, e.reason
                                 ) from None
