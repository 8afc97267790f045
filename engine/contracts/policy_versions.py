"""The policy version: which weights of a trainable conductor plan a run.

A version is a number: 0 is the base model the pool file names (`BASE`), K the weights the K-th
GRPO update published. In code it is an `int` (`Version`); written down (a workflow's JSON
payload, a trace, a pool file, a vLLM adapter name, a batch name) it is its label, "base" or
"vK", and that label is read back wherever a version is read, so a version never changes form
between a training run, the run options it pins and the worker that serves it. A *pin*
(`VersionPin`) is a version or `LATEST`, which follows the newest version the registry holds.

`Version` reads a label, a bare "K" or an int (a history recorded while the version was written
as a number still reads), and writes the label.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

from pydantic import BeforeValidator, Field, PlainSerializer

BASE: Final = "base"
"""The label of version 0: the base model the pool file names, before any update."""
LATEST: Final = "latest"
"""The pin that follows the newest published version (base until one is)."""

_LABEL = re.compile(r"^v?([0-9]{1,9})$")  # ASCII digits, bounded: int() of 5,000 raises


def version_label(version: int | Literal["latest"]) -> str:
    """How a version is written: "base" for 0, else "v3" (a pin `LATEST` as itself)."""
    if version == LATEST:
        return LATEST
    return BASE if version == 0 else f"v{version}"


def parse_version(label: str | int) -> int | None:
    """"base" → 0, "v3" or "3" (or 3) → 3, "latest" → None (follow the newest). ValueError, one
    line saying what is accepted, for anything else."""
    if isinstance(label, int) and not isinstance(label, bool):
        if label < 0:
            raise ValueError(f"policy version {label} is negative; versions count from 0 (base)")
        return label
    if label == BASE:
        return 0
    if label == LATEST:
        return None
    match = _LABEL.match(label) if isinstance(label, str) else None
    if match is None:
        shown = repr(label[:40]) if isinstance(label, str) else type(label).__name__
        raise ValueError(f"policy version {shown} is not 'base', 'latest', or vN like 'v3' "
                         "(N at most 9 digits)")
    return int(match.group(1))


def _version(value: Any) -> int:
    number = parse_version(value)
    if number is None:
        raise ValueError("policy version 'latest' is a pin, not a version: name one, like 'v3'")
    return number


def _pin(value: Any) -> int | str:
    number = parse_version(value)
    return LATEST if number is None else number


Version = Annotated[
    int, BeforeValidator(_version), Field(ge=0),
    PlainSerializer(version_label, return_type=str, when_used="json"),
]
"""A policy version: an int in code, its label ("base", "v3") in JSON."""

VersionPin = Annotated[
    int | Literal["latest"], BeforeValidator(_pin),
    PlainSerializer(version_label, return_type=str, when_used="json"),
]
"""A version to run: a `Version`, or "latest" (the registry's newest)."""
