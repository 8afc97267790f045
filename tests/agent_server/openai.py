"""OpenAI's two wire formats: Chat Completions (POST /v1/chat/completions, also what vLLM and
every OpenAI-compatible server speak) and the Responses API (POST /v1/responses, which the
OpenAI provider uses for calls with web search). Both share OpenAI's error envelope."""

from __future__ import annotations

import time
from typing import Any

from tests.agent_server.codec import AgentRequest, Codec, cited, plain, search_query, usage
from tests.agent_server.reply import Reply


def error(status: int, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "scripted_error", "param": None, "code": None}}


# ---------------------------------------------------------------- Chat Completions


def decode_chat(body: dict[str, Any], model: str) -> AgentRequest:
    fmt = body.get("response_format") or {}
    schema = (
        (fmt.get("json_schema") or {}).get("schema") if fmt.get("type") == "json_schema" else None
    )
    structured = body.get("structured_outputs") or {}  # vLLM's own field (extra_body)
    if "json" in structured:
        schema, fmt = structured["json"], {"type": "json_schema"}
    return AgentRequest(
        api="openai",
        model=str(body.get("model", model)),
        messages=[
            {"role": str(m.get("role")), "content": plain(m.get("content"))}
            for m in body.get("messages", [])
        ],
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        max_tokens=body.get("max_completion_tokens") or body.get("max_tokens"),
        json_schema=schema,
        wants_json=fmt.get("type") in ("json_schema", "json_object"),
        logprobs=bool(body.get("logprobs")),
        tools=list(body.get("tools") or []),
        web_search="web_search_options" in body,  # Chat Completions' *-search-* models
    )


def encode_chat(reply: Reply, request: AgentRequest) -> dict[str, Any]:
    inp, out = usage(reply, request)
    refused = reply.finish_reason == "refusal"
    choice: dict[str, Any] = {
        "index": 0,
        "message": {
            "role": "assistant",
            "content": None if refused else reply.text,
            "refusal": reply.text if refused else None,
        },
        "finish_reason": "length" if reply.finish_reason == "length" else "stop",
        "logprobs": None,
    }
    if request.body.get("return_token_ids") and reply.token_ids is not None:
        choice["token_ids"] = list(reply.token_ids)  # vLLM >= 0.10.2
    if request.logprobs and reply.token_ids is not None:
        lps = list(reply.logprobs) if reply.logprobs is not None else [-0.5] * len(reply.token_ids)
        choice["logprobs"] = {
            "content": [
                {"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
                for t, lp in zip(reply.token_ids, lps, strict=True)
            ]
        }
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.model,
        "choices": [choice],
        "usage": {"prompt_tokens": inp, "completion_tokens": out, "total_tokens": inp + out},
    }


# ---------------------------------------------------------------- Responses


def decode_responses(body: dict[str, Any], model: str) -> AgentRequest:
    """The Responses API: `input` is a string or a list of messages, system text may also come
    as `instructions`, and a JSON schema sits in `text.format`."""
    items = body.get("input") or []
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    instructions = body.get("instructions")
    messages = [{"role": "system", "content": str(instructions)}] if instructions else []
    messages += [
        {"role": str(m.get("role")), "content": plain(m.get("content"))}
        for m in items
        if isinstance(m, dict) and m.get("role")
    ]
    fmt = (body.get("text") or {}).get("format") or {}
    tools = list(body.get("tools") or [])
    return AgentRequest(
        api="responses",
        model=str(body.get("model", model)),
        messages=messages,
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        max_tokens=body.get("max_output_tokens"),
        json_schema=fmt.get("schema") if fmt.get("type") == "json_schema" else None,
        wants_json=fmt.get("type") in ("json_schema", "json_object"),
        tools=tools,
        web_search=any(str(t.get("type", "")).startswith("web_search") for t in tools),
    )


def encode_responses(reply: Reply, request: AgentRequest) -> dict[str, Any]:
    """A message item; after a search, a `web_search_call` item first and URL citation
    annotations on the text."""
    inp, out = usage(reply, request)
    citations = cited(reply, request)
    content: dict[str, Any]
    if reply.finish_reason == "refusal":
        content = {"type": "refusal", "refusal": reply.text}
    else:
        content = {
            "type": "output_text",
            "text": reply.text,
            "logprobs": [],
            "annotations": [
                {"type": "url_citation", "url": c.url, "title": c.title,
                 "start_index": 0, "end_index": len(reply.text)}
                for c in citations
            ],
        }
    output: list[dict[str, Any]] = []
    if citations:
        output.append({
            "type": "web_search_call", "id": "ws_scripted", "status": "completed",
            "action": {"type": "search", "query": search_query(request)},
        })
    output.append({
        "type": "message", "id": "msg_scripted", "role": "assistant", "status": "completed",
        "content": [content],
    })
    cut = reply.finish_reason == "length"
    return {
        "id": "resp_scripted",
        "object": "response",
        "created_at": time.time(),
        "model": request.model,
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": request.tools,
        "usage": {
            "input_tokens": inp,
            "output_tokens": out,
            "total_tokens": inp + out,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


CHAT = Codec(decode_chat, encode_chat, error)
RESPONSES = Codec(decode_responses, encode_responses, error)
