"""What a provider module is, and the typed way to reach one by name.

A provider is a module, not a class (one per API family: openai_provider, anthropic_provider,
google_provider, local, sim), imported by name on first use. `Provider` states what such a
module holds; `provider_module(name)` returns the module as one, so the engine's calls on it are
typed; and the assignments under TYPE_CHECKING below have the type checker check every provider
module against the protocol (a missing or mistyped member is an error on its module's line).

This module sits above the provider modules (it names them for the type checker) and below the
package's `complete` and `preload` (engine/providers/__init__.py); registry.py, which the pool
and every provider module import, stays below all of them.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, cast, runtime_checkable

from conductor_engine.engine.providers.registry import MODULES

if TYPE_CHECKING:
    from conductor_engine.engine.providers import (
        anthropic_provider,
        google_provider,
        local,
        openai_provider,
        sim,
    )
    from conductor_engine.engine.providers.base import Completion, CompletionRequest
    from conductor_engine.engine.providers.pool import AgentSpec
    from conductor_engine.engine.providers.registry import Capabilities


@runtime_checkable
class Provider(Protocol):
    """A provider module: `complete`, `preload` and its `CAPABILITIES`."""

    @property
    def CAPABILITIES(self) -> Mapping[str, Capabilities]:
        """What it can do, for each provider name it serves (registry.capabilities reads it)."""
        ...

    async def complete(self, spec: AgentSpec, request: CompletionRequest) -> Completion:
        """Call `spec`'s model once. Raises AgentCallError (base.py); never retries."""
        ...

    def preload(self) -> None:
        """Import what the first call would (its SDK) now, at a worker's start; importing the
        module itself must stay cheap, so reading CAPABILITIES costs no SDK."""
        ...


if TYPE_CHECKING:  # one line per module of registry.MODULES (a unit test keeps them equal)
    _openai: Provider = openai_provider
    _anthropic: Provider = anthropic_provider
    _google: Provider = google_provider
    _local: Provider = local
    _sim: Provider = sim


def provider_module(provider: str) -> Provider:
    """The module for a provider, imported on first use: a process that only parses plans, or
    a worker without the local extra, never pays for SDKs it does not use. (The cast is what
    the assignments above check for every module.)"""
    return cast(Provider, importlib.import_module(MODULES[provider]))
