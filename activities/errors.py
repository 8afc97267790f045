"""Turning a provider's AgentCallError into the ApplicationError Temporal acts on."""

from __future__ import annotations

from datetime import timedelta

from temporalio.exceptions import ApplicationError

from conductor_engine.engine.providers.base import AgentCallError


def to_application_error(error: AgentCallError) -> ApplicationError:
    """Retryable errors wait at least the server's Retry-After; the rest fail the step now."""
    delay = timedelta(seconds=error.retry_after) if error.retry_after is not None else None
    return ApplicationError(
        error.message,
        type=error.kind,
        non_retryable=not error.retryable,
        next_retry_delay=delay,
    )
