"""Conductor engine: a small conductor model writes plans, Temporal runs them, GRPO trains it.

The public face of the package: what a user's code imports.

    from conductor_engine import ConductorClient, Task, RunOptions, RunResult, Settings

Each name is imported on first use, from the module that defines it, so importing
`conductor_engine.workflows` inside Temporal's workflow sandbox (which runs this file as the
parent package) loads nothing from the client or its dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conductor_engine.engine.contracts.records import RunResult
    from conductor_engine.engine.contracts.tasks import RunOptions, Task
    from conductor_engine.engine.settings import Settings
    from conductor_engine.runtime.client import ConductorClient, RunFailed

__all__ = ["ConductorClient", "RunFailed", "RunOptions", "RunResult", "Settings", "Task"]

_HOMES = {
    "ConductorClient": "conductor_engine.runtime.client",
    "RunFailed": "conductor_engine.runtime.client",
    "RunOptions": "conductor_engine.engine.contracts.tasks",
    "RunResult": "conductor_engine.engine.contracts.records",
    "Settings": "conductor_engine.engine.settings",
    "Task": "conductor_engine.engine.contracts.tasks",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'conductor_engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
