"""Agent providers: one module per API family, all behind `complete(spec, request)`."""

from __future__ import annotations

from engine.pool import AgentSpec
from engine.providers.base import (
    AgentCallError,
    Completion,
    CompletionRequest,
    Message,
    Usage,
)

__all__ = ["AgentCallError", "Completion", "CompletionRequest", "Message", "Usage", "complete"]


async def complete(spec: AgentSpec, request: CompletionRequest) -> Completion:
    """Call one agent once. Raises AgentCallError; never retries (Temporal does)."""
    # Imported lazily so that a worker without the local extra, or a process that only
    # parses plans, never pays for SDKs it does not use.
    if spec.provider in ("openai", "openai-compatible"):
        from engine.providers import openai_provider as mod
    elif spec.provider == "anthropic":
        from engine.providers import anthropic_provider as mod  # type: ignore[no-redef]
    elif spec.provider == "google":
        from engine.providers import google_provider as mod  # type: ignore[no-redef]
    elif spec.provider == "local":
        from engine.providers import local as mod  # type: ignore[no-redef]
    else:  # pragma: no cover - the pool model rejects other names
        raise AgentCallError(f"agent {spec.id}: unknown provider {spec.provider}", retryable=False)
    completion = await mod.complete(spec, request)
    completion.cost_usd = spec.cost_usd(
        completion.usage.input_tokens, completion.usage.output_tokens
    )
    return completion
