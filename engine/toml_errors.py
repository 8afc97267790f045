"""One-line messages for files people write by hand in TOML (pool files, conductor.toml)."""

from __future__ import annotations

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
