"""Anthropic's Messages API (POST /v1/messages): system text outside the message list, JSON
output asked for in `output_config.format`, web search as a server tool whose blocks precede
the cited text."""

from __future__ import annotations

from typing import Any

from tests.agent_server.codec import AgentRequest, Codec, cited, plain, search_query, usage
from tests.agent_server.reply import Reply

_STOP = {"stop": "end_turn", "length": "max_tokens", "refusal": "refusal"}
_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def decode(body: dict[str, Any], model: str) -> AgentRequest:
    system = plain(body.get("system", ""))
    messages = [{"role": "system", "content": system}] if system else []
    messages += [
        {"role": str(m.get("role")), "content": plain(m.get("content"))}
        for m in body.get("messages", [])
    ]
    fmt = (body.get("output_config") or {}).get("format") or {}
    return AgentRequest(
        api="anthropic",
        model=str(body.get("model", model)),
        messages=messages,
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        max_tokens=body.get("max_tokens"),
        json_schema=fmt.get("schema"),
        wants_json=bool(fmt),
        tools=list(body.get("tools") or []),
        web_search=any(
            str(t.get("type", "")).startswith("web_search_") for t in body.get("tools") or []
        ),
    )


def _content(reply: Reply, request: AgentRequest) -> list[dict[str, Any]]:
    """A text block; after a search, the server tool's blocks first and citations on the text."""
    citations = cited(reply, request)
    if not citations:
        return [{"type": "text", "text": reply.text}]
    search = {
        "type": "server_tool_use", "id": "srvtoolu_scripted", "name": "web_search",
        "input": {"query": search_query(request)},
    }
    results = {
        "type": "web_search_tool_result",
        "tool_use_id": "srvtoolu_scripted",
        "content": [
            {"type": "web_search_result", "url": c.url, "title": c.title,
             "encrypted_content": "scripted", "page_age": None}
            for c in citations
        ],
    }
    locations = [
        {"type": "web_search_result_location", "url": c.url, "title": c.title,
         "cited_text": c.snippet or "", "encrypted_index": "scripted"}
        for c in citations
    ]
    return [search, results, {"type": "text", "text": reply.text, "citations": locations}]


def encode(reply: Reply, request: AgentRequest) -> dict[str, Any]:
    inp, out = usage(reply, request)
    refused = reply.finish_reason == "refusal"
    return {
        "id": "msg_scripted",
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": [] if refused else _content(reply, request),
        "stop_reason": _STOP[reply.finish_reason],
        "stop_sequence": None,
        "usage": {"input_tokens": inp, "output_tokens": out},
    }


def error(status: int, message: str) -> dict[str, Any]:
    kind = _ERRORS.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


MESSAGES = Codec(decode, encode, error)
