"""Anthropic's Messages API, through the official `anthropic` SDK.

The SDK's own retries are off (`max_retries=0`): Temporal retries. System messages travel in
the separate `system` field, as the Messages API wants. `json_schema` is ignored: not every
Claude model offers constrained JSON output, and the plan parser reads free text anyway.

With web search on, the server runs Anthropic's `web_search` tool inside the one call: the
reply interleaves `server_tool_use` and `web_search_tool_result` blocks with text blocks whose
`citations` name the pages used. The answer is the text blocks joined; the citations are kept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from conductor_engine.engine.contracts.agent_calls import Citation, Usage, unique_citations
from conductor_engine.engine.providers import errors
from conductor_engine.engine.providers.base import ClientCache, Completion, CompletionRequest
from conductor_engine.engine.providers.pool import AgentSpec, WebSearch
from conductor_engine.engine.providers.registry import Capabilities

if TYPE_CHECKING:
    import anthropic

CAPABILITIES = {
    "anthropic": Capabilities(
        structured_output=False,  # see above: json_schema is ignored
        web_search_options=frozenset(
            {"max_uses", "allowed_domains", "blocked_domains", "user_location"}),
    ),
}

# The web search tool version: the one every current Claude model accepts.
WEB_SEARCH_TOOL = "web_search_20250305"

# Anthropic's stop reasons in the vocabulary the rest of the engine uses (OpenAI's).
_FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
}


def preload() -> None:
    """Import the SDK now (a worker's start) rather than in the first call; importing this
    module alone does not, so reading CAPABILITIES costs no SDK import."""
    import anthropic  # noqa: F401


def _build(spec: AgentSpec, key: str) -> anthropic.AsyncAnthropic:
    import anthropic

    # An explicit timeout also stops the SDK refusing large non-streaming max_tokens
    # ("streaming is required ..."), a guess that only applies to its default timeout.
    return anthropic.AsyncAnthropic(
        api_key=key, base_url=spec.base_url, max_retries=0, timeout=spec.timeout_s
    )


_clients = ClientCache(_build)


def _arguments(spec: AgentSpec, request: CompletionRequest) -> dict[str, Any]:
    """messages.create arguments: system text split out, sampling from request or pool."""
    system = "\n\n".join(m.content for m in request.messages if m.role == "system")
    args: dict[str, Any] = {
        "model": spec.model,
        "max_tokens": request.max_tokens,
        "messages": [
            {"role": m.role, "content": m.content} for m in request.messages if m.role != "system"
        ],
    }
    if system:
        args["system"] = system
    temperature = (
        request.temperature if request.temperature is not None else spec.params.temperature
    )
    top_p = request.top_p if request.top_p is not None else spec.params.top_p
    # This SDK version no longer lists the sampling fields, so they go in the body directly.
    # Newer Claude models reject temperature and top_p together; temperature wins.
    sampling: dict[str, float] = {}
    if temperature is not None:
        sampling["temperature"] = temperature
    elif top_p is not None:
        sampling["top_p"] = top_p
    if sampling:
        args["extra_body"] = sampling
    if request.web_search is not None:
        args["tools"] = [_web_search_tool(request.web_search)]
    return args


def _web_search_tool(search: WebSearch) -> dict[str, Any]:
    """Anthropic's server-side web search tool with the pool's limits, domains and location."""
    tool: dict[str, Any] = {"type": WEB_SEARCH_TOOL, "name": "web_search"}
    if search.max_uses is not None:
        tool["max_uses"] = search.max_uses
    if search.allowed_domains:
        tool["allowed_domains"] = list(search.allowed_domains)
    if search.blocked_domains:
        tool["blocked_domains"] = list(search.blocked_domains)
    if search.user_location is not None:
        where = search.user_location.model_dump(exclude_none=True)
        tool["user_location"] = {"type": "approximate", **where}
    return tool


def _citations(blocks: list[Any]) -> list[Citation]:
    """The web pages the text blocks cite, with the passage quoted from each."""
    return [
        Citation(
            url=str(c.url),
            title=str(getattr(c, "title", None) or ""),
            snippet=getattr(c, "cited_text", None) or None,
        )
        for b in blocks
        if getattr(b, "type", None) == "text"
        for c in getattr(b, "citations", None) or []
        if getattr(c, "type", None) == "web_search_result_location"
    ]


def _completion(spec: AgentSpec, message: Any) -> Completion:
    """Read the answer out of a Message; raise if the body lacks what the API promises."""
    blocks = getattr(message, "content", None)
    stop_reason = getattr(message, "stop_reason", None)
    if stop_reason == "refusal":
        details = getattr(message, "stop_details", None)
        why = getattr(details, "explanation", None) or getattr(details, "category", None)
        raise errors.refusal(spec, f"stop_reason refusal: {why}" if why else "stop_reason refusal")
    if blocks is None or getattr(message, "usage", None) is None:
        raise errors.malformed_response(spec, "the message has no content or no usage")
    text = "".join(
        str(getattr(b, "text", "")) for b in blocks if getattr(b, "type", None) == "text"
    )
    usage = message.usage
    return Completion(
        text=text,
        usage=Usage(
            input_tokens=int(getattr(usage, "input_tokens", 0) or 0),
            output_tokens=int(getattr(usage, "output_tokens", 0) or 0),
        ),
        model=str(getattr(message, "model", None) or spec.model),
        finish_reason=_FINISH_REASONS.get(str(stop_reason), stop_reason),
        citations=unique_citations(_citations(blocks)),
    )


async def complete(spec: AgentSpec, request: CompletionRequest) -> Completion:
    """One Messages call, no retries; every failure becomes an AgentCallError."""
    import anthropic

    key = errors.require_api_key(spec)
    client = _clients.get(spec, key)
    return await errors.call_sdk(
        anthropic, spec, key, lambda: client.messages.create(**_arguments(spec, request)),
        _completion,
    )
