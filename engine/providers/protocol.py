"""What a provider module is: the functions and the declaration the engine calls on it.

A provider is a module, not a class (one per API family: openai_provider, anthropic_provider,
google_provider, local, sim), imported by name on first use (registry.py). `Provider` states
what such a module must hold, so the type checker checks every provider module against it
(registry.py assigns each one to a `Provider` under TYPE_CHECKING) and the engine's calls
through `provider_module(name)` are typed instead of reaching into an untyped module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # base.py and the pool import the registry, which imports this module
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
