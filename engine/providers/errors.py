"""How every provider turns a failed call into an AgentCallError: written once, used by all.

Temporal owns retries, so this module decides only *whether* a failure is worth another attempt
and *when* (Retry-After), and writes a message a person can act on. The provider modules catch
their own SDK's exception classes and hand the facts (status, headers, server message) to the
builders here, so "which HTTP statuses are retried" and "what does a 401 tell the user" live in
one place whatever SDK raised them.

Every message names the agent id; none ever contains an API key (server messages are scrubbed
of the key before they are quoted, since some servers echo part of it back).
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, Mapping
from types import ModuleType
from typing import Any

from conductor_engine.engine.providers.base import (
    AgentCallError,
    Completion,
    is_retryable_status,
    parse_retry_after,
)
from conductor_engine.engine.providers.pool import AgentSpec
from conductor_engine.engine.redaction import redact_url

# `kind` values: the activity can use them as Temporal error types, and tests can match them.
KEY_MISSING = "AgentKeyMissing"
AUTH_FAILED = "AgentAuthFailed"
BAD_REQUEST = "AgentBadRequest"
RATE_LIMITED = "AgentRateLimited"
UNAVAILABLE = "AgentUnavailable"
TIMEOUT = "AgentTimeout"
CONNECTION = "AgentConnectionError"
MALFORMED = "AgentMalformedResponse"
REFUSED = "AgentRefused"

# A placeholder key for self-hosted OpenAI-compatible servers (vLLM) that check no key; the SDK
# refuses to start without one.
PLACEHOLDER_KEY = "EMPTY"

_MAX_QUOTE = 500  # characters of a server's message quoted in ours


def require_api_key(spec: AgentSpec, env: Mapping[str, str] | None = None) -> str:
    """The agent's key, read from the environment at call time (never from the pool file).

    Read per call rather than at start-up so a person can fix a missing key and let Temporal's
    next attempt succeed without restarting workers.
    """
    env = os.environ if env is None else env
    if spec.api_key_env is None:
        if spec.base_url is not None:
            return PLACEHOLDER_KEY
        raise AgentCallError(
            f"agent {spec.id}: the pool file gives no api_key_env for this {spec.provider} agent; "
            f'add api_key_env = "NAME" to the agent and set the environment variable NAME '
            f"to a valid key",
            retryable=False,
            kind=KEY_MISSING,
        )
    key = env.get(spec.api_key_env, "").strip()
    if not key:
        raise AgentCallError(
            f"agent {spec.id}: the environment variable {spec.api_key_env} is not set; "
            f"set the environment variable {spec.api_key_env} to a valid key for {spec.provider}",
            retryable=False,
            kind=KEY_MISSING,
        )
    return key


def server_message(body: Any, fallback: str = "") -> str:
    """The human part of an error body, whatever the API family's envelope.

    OpenAI sends {"error": {"message": ...}}, Anthropic {"type": "error", "error": {...}},
    Google {"error": {"code", "message", "status"}}; some SDKs have already unwrapped "error".
    """
    if isinstance(body, Mapping):
        inner = body.get("error")
        if isinstance(inner, Mapping) and isinstance(inner.get("message"), str):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
        if isinstance(body.get("message"), str):
            return str(body["message"])
    if isinstance(body, str | bytes) and body:
        return body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    return fallback


def _quote(text: str, secret: str | None) -> str:
    """Shorten a server message and remove the key from it, if the server echoed it."""
    text = " ".join(text.split())
    if secret and secret != PLACEHOLDER_KEY:
        text = text.replace(secret, "***")
    if len(text) > _MAX_QUOTE:
        text = text[:_MAX_QUOTE] + "..."
    return text or "(no message)"


def retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
    """Seconds the server asked us to wait: `retry-after-ms` (OpenAI, Anthropic) or the
    standard `Retry-After` in seconds. Header lookups must be case-insensitive; the SDKs'
    httpx Headers are."""
    if headers is None:
        return None
    millis = headers.get("retry-after-ms")
    if millis:
        seconds = parse_retry_after(millis)
        if seconds is not None:
            return seconds / 1000.0
    return parse_retry_after(headers.get("retry-after"))


def status_error(
    spec: AgentSpec,
    status: int,
    message: str,
    headers: Mapping[str, str] | None = None,
    *,
    secret: str | None = None,
) -> AgentCallError:
    """An HTTP error status from the agent's server, classified for Temporal."""
    quoted = _quote(message, secret)
    if is_retryable_status(status):
        kind = RATE_LIMITED if status == 429 else UNAVAILABLE
        what = "rate limited" if status == 429 else "temporarily unavailable"
        return AgentCallError(
            f"agent {spec.id}: {what} (HTTP {status}): {quoted}; will be retried",
            retryable=True,
            retry_after=retry_after_seconds(headers),
            status=status,
            kind=kind,
        )
    if status in (401, 403):
        fix = (
            f"set the environment variable {spec.api_key_env} to a valid key"
            if spec.api_key_env
            else 'add api_key_env = "NAME" to this agent in the pool file and set the '
            "environment variable NAME to a valid key"
        )
        return AgentCallError(
            f"agent {spec.id}: the server rejected the API key (HTTP {status}): {quoted}; {fix}",
            retryable=False,
            status=status,
            kind=AUTH_FAILED,
        )
    hint = ""
    if status == 404:
        hint = (
            f"; check the model name {spec.model!r}"
            + (f" and base_url {redact_url(spec.base_url)!r}" if spec.base_url else "")
            + " in the pool file"
        )
    return AgentCallError(
        f"agent {spec.id}: bad request (HTTP {status}): {quoted}{hint}",
        retryable=False,
        status=status,
        kind=BAD_REQUEST,
    )


def timeout_error(spec: AgentSpec) -> AgentCallError:
    """No complete answer within the agent's per-attempt timeout: a hung or overloaded agent."""
    return AgentCallError(
        f"agent {spec.id}: no answer within timeout_s={spec.timeout_s:g} s (the per-attempt "
        f"timeout in the pool file); will be retried",
        retryable=True,
        kind=TIMEOUT,
    )


def connection_error(spec: AgentSpec, detail: str) -> AgentCallError:
    """The agent's server could not be reached (refused, reset, DNS): usually transient."""
    where = redact_url(spec.base_url) if spec.base_url else f"the {spec.provider} API"
    return AgentCallError(
        f"agent {spec.id}: could not reach {where}: {_quote(detail, None)}; will be retried",
        retryable=True,
        kind=CONNECTION,
    )


def malformed_response(spec: AgentSpec, detail: str) -> AgentCallError:
    """A 200 whose body is not what the API promises (bad JSON, missing fields).

    Retryable: in practice this is a proxy or an overloaded server cutting a body short.
    """
    return AgentCallError(
        f"agent {spec.id}: the agent returned a malformed response ({_quote(detail, None)}); "
        f"will be retried",
        retryable=True,
        kind=MALFORMED,
    )


def refusal(spec: AgentSpec, detail: str) -> AgentCallError:
    """The model declined (safety or policy): asking again with the same prompt will not help."""
    return AgentCallError(
        f"agent {spec.id}: the agent refused to answer ({_quote(detail, None)})",
        retryable=False,
        kind=REFUSED,
    )


def read_body(
    spec: AgentSpec, to_completion: Callable[[AgentSpec, Any], Completion], body: Any
) -> Completion:
    """Turn an SDK response into a Completion. The SDKs accept a 200 whose JSON lacks the
    promised fields and hand back objects full of None, so a failure here is a malformed body."""
    try:
        return to_completion(spec, body)
    except AgentCallError:
        raise
    except (AttributeError, TypeError, ValueError, IndexError, KeyError) as e:
        raise malformed_response(spec, f"unexpected body shape: {e}") from e


async def call_sdk(
    sdk: ModuleType,
    spec: AgentSpec,
    key: str,
    send: Callable[[], Awaitable[Any]],
    read: Callable[[AgentSpec, Any], Completion],
) -> Completion:
    """Send one request through the `openai` or `anthropic` SDK and read its body. Both SDKs
    are generated alike and raise the same exception classes, so one mapping serves both."""
    try:
        response = await send()
    except sdk.APITimeoutError as e:
        raise timeout_error(spec) from e
    except sdk.APIConnectionError as e:
        raise connection_error(spec, str(e.__cause__ or e)) from e
    except sdk.APIStatusError as e:
        message = server_message(e.body, e.message)
        raise status_error(
            spec, e.status_code, message, e.response.headers, secret=key
        ) from None  # the SDK's error quotes the server verbatim, which may echo the key
    except (sdk.APIResponseValidationError, json.JSONDecodeError) as e:
        raise malformed_response(spec, f"invalid JSON body: {e}") from e
    return read_body(spec, read, response)
