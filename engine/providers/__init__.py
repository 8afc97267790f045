"""Agent providers: one module per API family, all behind `complete(spec, request)`."""

from __future__ import annotations

from collections.abc import Iterable

from conductor_engine.engine.contracts.agent_calls import Citation, Message, TaskInfo, Usage
from conductor_engine.engine.contracts.agents import AgentSpec
from conductor_engine.engine.providers import errors
from conductor_engine.engine.providers.base import AgentCallError, Completion, CompletionRequest
from conductor_engine.engine.providers.prices import call_cost
from conductor_engine.engine.providers.protocol import Provider, provider_module
from conductor_engine.engine.providers.registry import (
    Capabilities,
    capabilities,
    listed,
    web_search_providers,
)

__all__ = [
    "AgentCallError", "Capabilities", "Citation", "Completion", "CompletionRequest", "Message",
    "Provider", "TaskInfo", "Usage",
    "capabilities", "complete", "preload", "provider_module",
]


def preload(specs: Iterable[AgentSpec]) -> None:
    """Import the SDKs a pool needs now (a worker's start), not inside the first activity,
    where a second-long import would stall the event loop and every call sharing it."""
    for provider in {s.provider for s in specs}:
        provider_module(provider).preload()


async def complete(spec: AgentSpec, request: CompletionRequest) -> Completion:
    """Call one agent once. Raises AgentCallError; never retries (Temporal does)."""
    if request.web_search is not None and capabilities(spec.provider).web_search_options is None:
        # The pool refuses this; a request built by hand must not silently search nothing.
        raise AgentCallError(
            f"agent {spec.id}: web search was asked of a {spec.provider} agent, which has no "
            f"search tool; only {listed(web_search_providers(), 'and')} agents can search the "
            f"web",
            retryable=False,
            kind=errors.BAD_REQUEST,
        )
    completion = await provider_module(spec.provider).complete(spec, request)
    completion.cost_usd = call_cost(
        spec, completion.usage.input_tokens, completion.usage.output_tokens
    )
    return completion
