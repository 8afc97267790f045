"""Text a task may carry: every string must be storable as PostgreSQL `text`, and the whole task
at most MAX_TASK_BYTES as JSON (engine/contracts/limits.py says why).

PostgreSQL text cannot hold NUL (U+0000), and no UTF-8 encoder can write a lone surrogate
(U+D800-U+DFFF, which a JSON `\\ud800` escape produces). A task holding either loads and runs,
then fails when its trace is recorded, long after the person who wrote it has gone. So task
sources check every string of a task, nested ones and mapping keys included, where it enters,
and name the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from conductor_engine.engine.contracts.limits import MAX_TASK_BYTES, size_label

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _why(text: str) -> str | None:
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    char, at = found.group(), found.start()
    if char == "\x00":
        return (f"holds a NUL character (U+0000) at character {at}, which PostgreSQL text "
                "cannot store; remove it")
    return (f"holds a lone surrogate U+{ord(char):04X} at character {at} (half of a "
            "\\ud800-\\udfff escape pair, or bytes that are not UTF-8), which cannot be "
            "stored; remove it or give the whole pair")


def unstorable_text(value: Any, field: str = "") -> tuple[str, str] | None:
    """The first string inside `value` (a str, list, tuple, mapping or pydantic model, nested)
    that cannot be stored, as (field path like `tags.1` or `options.policy_version`, why);
    None when every string is fine."""
    if isinstance(value, str):
        why = _why(value)
        return None if why is None else (field or "value", why)
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if isinstance(value, Mapping):
        for key, item in value.items():
            name = ascii(key) if isinstance(key, str) and _why(key) else str(key)
            path = f"{field}.{name}" if field else name
            if isinstance(key, str) and (why := _why(key)) is not None:
                return path, f"(the key) {why}"
            if (found := unstorable_text(item, path)) is not None:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            if (found := unstorable_text(item, f"{field}.{index}" if field else str(index))):
                return found
    return None


def check_storable(value: Any, field: str = "") -> None:
    """Raise ValueError(`field X: why`) for the first string that cannot be stored."""
    found = unstorable_text(value, field)
    if found is not None:
        raise ValueError(f"field {found[0]}: {found[1]}")


class TaskTooLarge(ValueError):
    """A task over MAX_TASK_BYTES as JSON; the message is one line saying what to shorten."""

    def __init__(self, message: str, size: int) -> None:
        super().__init__(message)
        self.size = size


def task_bytes(task: BaseModel) -> int:
    """How many bytes `task` is as JSON: what Temporal carries in each payload holding it."""
    return len(task.__pydantic_serializer__.to_json(task))


FIX = "shorten its question, context or reference"


def _oversize(size: int, what: str, fix: str) -> str:
    return (f"{what} is {size_label(size)} as JSON, over the {size_label(MAX_TASK_BYTES)} a "
            f"task may be (every step of its run carries it through Temporal): {fix}")


def oversize_error(task: BaseModel, what: str = "the task", fix: str = FIX) -> str | None:
    """One line saying that `task` is over MAX_TASK_BYTES and what to do, or None."""
    size = task_bytes(task)
    return _oversize(size, what, fix) if size > MAX_TASK_BYTES else None


def check_size(task: BaseModel, what: str = "the task", fix: str = FIX) -> None:
    """Raise TaskTooLarge (`oversize_error`'s line) for a task over MAX_TASK_BYTES."""
    size = task_bytes(task)
    if size > MAX_TASK_BYTES:
        raise TaskTooLarge(_oversize(size, what, fix), size)
