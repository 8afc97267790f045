"""Google's Gemini API, through the official `google-genai` SDK.

Retries are off in two places, because the SDK retries in two places: `HttpRetryOptions
(attempts=1)` stops its tenacity loop, and *setting* retry options at all also stops its
separate, implicit retry of connection errors on the aiohttp transport. Automatic continuation
is off too, so one `complete()` is exactly one HTTP request and Temporal sees every failure.

With web search on, the call is grounded with Google Search: Gemini searches inside the call
and returns `grounding_metadata` whose chunks are the pages used and whose supports tie
sentences of the answer to them; those become the completion's citations.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

from conductor_engine.engine.contracts.agent_calls import Citation, Usage, unique_citations
from conductor_engine.engine.providers import errors
from conductor_engine.engine.providers.base import (
    AgentCallError,
    ClientCache,
    Completion,
    CompletionRequest,
)
from conductor_engine.engine.providers.pool import AgentSpec
from conductor_engine.engine.providers.registry import Capabilities

if TYPE_CHECKING:
    from google import genai
    from google.genai import errors as genai_errors
    from google.genai import types

# The Gemini API's Google Search tool takes no options (domain filters are Vertex-only).
CAPABILITIES = {
    "google": Capabilities(structured_output=True, web_search_options=frozenset()),
}


def preload() -> None:
    """Import the SDK now (a worker's start) rather than in the first call; importing this
    module alone does not, so reading CAPABILITIES costs no SDK import."""
    from google import genai  # noqa: F401

    _transport_exceptions()


@functools.cache
def _transport_exceptions() -> tuple[
    tuple[type[BaseException], ...], tuple[type[BaseException], ...]
]:
    """(timeout, other transport) exception classes of whichever httpx flavours are installed.

    google-genai sends through httpx or its fork httpx2, whichever is present, and does not
    wrap their exceptions as the OpenAI and Anthropic SDKs do.
    """
    timeouts: list[type[BaseException]] = [TimeoutError]
    transport: list[type[BaseException]] = [ConnectionError]
    for name in ("httpx", "httpx2"):
        try:
            module = __import__(name)
        except ImportError:
            continue
        timeouts.append(module.TimeoutException)
        transport.append(module.TransportError)
    return tuple(timeouts), tuple(transport)


# Finish reasons that mean "the safety filter stopped the answer": not worth a retry.
_REFUSALS = frozenset({"SAFETY", "PROHIBITED_CONTENT", "BLOCKLIST", "SPII", "IMAGE_SAFETY"})
_FINISH_REASONS = {"STOP": "stop", "MAX_TOKENS": "length"}


def _build(spec: AgentSpec, key: str) -> genai.Client:
    from google import genai
    from google.genai import types

    return genai.Client(
        # Explicit, so GOOGLE_GENAI_USE_VERTEXAI in the environment cannot redirect calls.
        vertexai=False,
        api_key=key,
        http_options=types.HttpOptions(
            base_url=spec.base_url,
            timeout=max(1, round(spec.timeout_s * 1000)),  # milliseconds
            retry_options=types.HttpRetryOptions(attempts=1),
        ),
    )


_clients = ClientCache(_build)


def _config(spec: AgentSpec, request: CompletionRequest) -> types.GenerateContentConfig:
    """Generation settings: system text split out, sampling from request or pool, JSON schema."""
    from google.genai import types

    system = "\n\n".join(m.content for m in request.messages if m.role == "system")
    temperature = (
        request.temperature if request.temperature is not None else spec.params.temperature
    )
    top_p = request.top_p if request.top_p is not None else spec.params.top_p
    config = types.GenerateContentConfig(
        system_instruction=system or None,
        temperature=temperature,
        top_p=top_p,
        max_output_tokens=request.max_tokens,
        automatic_continuation=False,
    )
    if request.json_schema is not None and spec.structured_output:
        # `response_json_schema` takes plain JSON Schema; `response_schema` would need
        # Google's OpenAPI subset.
        config.response_mime_type = "application/json"
        config.response_json_schema = request.json_schema
    if request.web_search is not None:
        # The Gemini API's Google Search tool takes no options (domain filters are Vertex-only).
        config.tools = [types.Tool(google_search=types.GoogleSearch())]
    return config


def _citations(candidate: Any) -> list[Citation]:
    """The web pages Google Search grounding used, each with the first answer sentence it
    supports (a chunk no sentence points at is still a source the model read)."""
    meta = getattr(candidate, "grounding_metadata", None)
    chunks = getattr(meta, "grounding_chunks", None) or []
    supported: dict[int, str] = {}
    for support in getattr(meta, "grounding_supports", None) or []:
        sentence = getattr(getattr(support, "segment", None), "text", None)
        for i in getattr(support, "grounding_chunk_indices", None) or []:
            if sentence:
                supported.setdefault(i, sentence)
    return [
        Citation(url=str(web.uri), title=str(web.title or ""), snippet=supported.get(i))
        for i, chunk in enumerate(chunks)
        if (web := getattr(chunk, "web", None)) is not None and getattr(web, "uri", None)
    ]


def _contents(request: CompletionRequest) -> list[types.Content]:
    """The conversation without system messages; Gemini calls the assistant "model"."""
    from google.genai import types

    return [
        types.Content(
            role="model" if m.role == "assistant" else "user",
            parts=[types.Part(text=m.content)],
        )
        for m in request.messages
        if m.role != "system"
    ]


def _reason(value: Any) -> str | None:
    """An enum member or a plain string, as its upper-case name."""
    if value is None:
        return None
    return str(getattr(value, "value", value)).upper()


def _completion(spec: AgentSpec, response: Any) -> Completion:
    """Read the answer; blocked prompts and safety stops are refusals, an empty body malformed."""
    feedback = getattr(response, "prompt_feedback", None)
    blocked = _reason(getattr(feedback, "block_reason", None))
    if blocked and blocked != "BLOCKED_REASON_UNSPECIFIED":
        detail = getattr(feedback, "block_reason_message", None) or blocked
        raise errors.refusal(spec, f"prompt blocked: {detail}")
    candidates = getattr(response, "candidates", None)
    if not candidates:
        raise errors.malformed_response(spec, "no candidates in the response")
    candidate = candidates[0]
    finish = _reason(getattr(candidate, "finish_reason", None))
    if finish in _REFUSALS:
        raise errors.refusal(spec, f"finish_reason {finish}")
    parts = getattr(getattr(candidate, "content", None), "parts", None) or []
    # Thought summaries are not the answer.
    text = "".join(p.text for p in parts if getattr(p, "text", None) and not p.thought)
    if not text and finish is None:
        raise errors.malformed_response(spec, "a candidate with no text and no finish_reason")
    meta = getattr(response, "usage_metadata", None)
    return Completion(
        text=text,
        usage=Usage(
            input_tokens=int(getattr(meta, "prompt_token_count", 0) or 0),
            # Thinking tokens are billed as output, so they count as output here too.
            output_tokens=int(getattr(meta, "candidates_token_count", 0) or 0)
            + int(getattr(meta, "thoughts_token_count", 0) or 0),
        ),
        model=str(getattr(response, "model_version", None) or spec.model),
        finish_reason=_FINISH_REASONS.get(finish, finish.lower()) if finish else None,
        citations=unique_citations(_citations(candidate)),
    )


def _status_error(spec: AgentSpec, e: genai_errors.APIError, key: str) -> AgentCallError:
    response = getattr(e, "response", None)
    headers = getattr(response, "headers", None)
    message = e.message if isinstance(e.message, str) else errors.server_message(e.details)
    return errors.status_error(spec, int(e.code or 0), message, headers, secret=key)


async def complete(spec: AgentSpec, request: CompletionRequest) -> Completion:
    """One generateContent call, no retries; every failure becomes an AgentCallError."""
    from google.genai import errors as genai_errors

    timeouts, transport_errors = _transport_exceptions()
    key = errors.require_api_key(spec)
    client = _clients.get(spec, key)
    try:
        response = await client.aio.models.generate_content(
            model=spec.model, contents=_contents(request), config=_config(spec, request)
        )
    except genai_errors.APIError as e:
        # Not chained: the SDK's error quotes the server verbatim, which may echo the key.
        raise _status_error(spec, e, key) from None
    except timeouts as e:
        raise errors.timeout_error(spec) from e
    except transport_errors as e:
        raise errors.connection_error(spec, f"{type(e).__name__}: {e}") from e
    except (genai_errors.UnknownApiResponseError, json.JSONDecodeError) as e:
        raise errors.malformed_response(spec, f"invalid JSON body: {e}") from e
    return errors.read_body(spec, _completion, response)
