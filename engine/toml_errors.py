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


_KEY = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')"""
_KEYS = rf"{_KEY}(?:\s*\.\s*{_KEY})*"
_ARRAY_HEADER = re.compile(rf"\s*\[\[\s*({_KEYS})\s*\]\]")
_HEADER = re.compile(rf"\s*\[\s*({_KEYS})\s*\]")
_ASSIGNMENT = re.compile(rf"\s*({_KEYS})\s*=\s*(.*)")
_PART = re.compile(_KEY)


def _parts(keys: str) -> list[str]:
    return [p[1:-1] if p[0] in "\"'" else p for p in _PART.findall(keys)]


def toml_lines(text: str) -> dict[tuple[str | int, ...], int]:
    """The line where each table and key of a TOML text is set, by its path as pydantic's
    error locations name it (`("agents", 1, "timeout_s")`: arrays of tables are counted), and
    every prefix of that path, first occurrence kept. tomllib keeps no positions, so this reads
    the text line by line: headers, `key = ...` and dotted keys, skipping multi-line strings. A
    key inside an inline table or array is not listed (its line is its parent's)."""
    lines: dict[tuple[str | int, ...], int] = {}
    arrays: dict[tuple[str | int, ...], int] = {}  # array of tables -> its current index

    def resolve(parts: list[str]) -> tuple[str | int, ...]:
        path: tuple[str | int, ...] = ()
        for part in parts:
            path += (part,)
            if path in arrays:
                path += (arrays[path],)
        return path

    def record(path: tuple[str | int, ...], number: int) -> None:
        for n in range(1, len(path) + 1):
            lines.setdefault(path[:n], number)

    table: tuple[str | int, ...] = ()
    open_string: str | None = None  # the delimiter of the multi-line string being read
    for number, line in enumerate(text.splitlines(), start=1):
        if open_string is not None:
            if line.count(open_string) % 2:
                open_string = None
            continue
        if (m := _ARRAY_HEADER.match(line)) is not None:
            parts = _parts(m.group(1))
            array = resolve(parts[:-1]) + (parts[-1],)
            arrays[array] = arrays.get(array, -1) + 1
            table = array + (arrays[array],)
            record(table, number)
        elif (m := _HEADER.match(line)) is not None:
            table = resolve(_parts(m.group(1)))
            record(table, number)
        elif (m := _ASSIGNMENT.match(line)) is not None:
            record(table + tuple(_parts(m.group(1))), number)
            for delimiter in ('"""', "'''"):
                if m.group(2).startswith(delimiter) and m.group(2).count(delimiter) % 2:
                    open_string = delimiter
    return lines
