"""Agent providers: one module per API family, all behind `complete(spec, request)`."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from types import ModuleType

from conductor_engine.engine.providers import errors
from conductor_engine.engine.providers.base import (
    AgentCallError,
    Citation,
    Completion,
    CompletionRequest,
    Message,
    TaskInfo,
    Usage,
)
from conductor_engine.engine.providers.pool import WEB_SEARCH_OPTIONS, AgentSpec

__all__ = [
    "AgentCallError", "Citation", "Completion", "CompletionRequest", "Message", "TaskInfo",
    "Usage",
    "complete", "preload",
]


_MODULES = {
    "openai": "conductor_engine.engine.providers.openai_provider",
    "openai-compatible": "conductor_engine.engine.providers.openai_provider",
    "anthropic": "conductor_engine.engine.providers.anthropic_provider",
    "google": "conductor_engine.engine.providers.google_provider",
    "local": "conductor_engine.engine.providers.local",
    "sim": "conductor_engine.engine.providers.sim",
}


def provider_module(provider: str) -> ModuleType:
    """The module for a provider, imported on first use: a process that only parses plans, or
    a worker without the local extra, never pays for SDKs it does not use."""
    return importlib.import_module(_MODULES[provider])


def preload(specs: Iterable[AgentSpec]) -> None:
    """Import the SDKs a pool needs now (a worker's start), not inside the first activity,
    where a second-long import would stall the event loop and every call sharing it."""
    for provider in {s.provider for s in specs}:
        provider_module(provider)


async def complete(spec: AgentSpec, request: CompletionRequest) -> Completion:
    """Call one agent once. Raises AgentCallError; never retries (Temporal does)."""
    if request.web_search is not None and spec.provider not in WEB_SEARCH_OPTIONS:
        # The pool refuses this; a request built by hand must not silently search nothing.
        raise AgentCallError(
            f"agent {spec.id}: web search was asked of a {spec.provider} agent, which has no "
            f"search tool; only openai, anthropic and google agents can search the web",
            retryable=False,
            kind=errors.BAD_REQUEST,
        )
    completion = await provider_module(spec.provider).complete(spec, request)
    completion.cost_usd = spec.cost_usd(
        completion.usage.input_tokens, completion.usage.output_tokens
    )
    return completion
