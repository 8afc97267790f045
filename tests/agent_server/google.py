"""Google's Gemini API (POST /{v1,v1beta}/models/{model}:generateContent): the model in the path,
fields in camelCase or snake_case, web search answered with `groundingMetadata`."""

from __future__ import annotations

from typing import Any

from tests.agent_server.codec import AgentRequest, Codec, cited, plain, search_query, usage
from tests.agent_server.reply import Reply

_FINISH = {"stop": "STOP", "length": "MAX_TOKENS", "refusal": "SAFETY"}
_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def decode(body: dict[str, Any], model: str) -> AgentRequest:
    def pick(d: dict[str, Any], camel: str, snake: str) -> Any:
        return d.get(camel, d.get(snake))

    system = plain(pick(body, "systemInstruction", "system_instruction") or "")
    messages = [{"role": "system", "content": system}] if system else []
    messages += [
        {
            "role": "assistant" if c.get("role") == "model" else "user",
            "content": plain(c.get("parts", [])),
        }
        for c in body.get("contents", [])
    ]
    gen = pick(body, "generationConfig", "generation_config") or {}
    schema = pick(gen, "responseJsonSchema", "response_json_schema") or pick(
        gen, "responseSchema", "response_schema"
    )
    return AgentRequest(
        api="gemini",
        model=model,
        messages=messages,
        temperature=gen.get("temperature"),
        top_p=pick(gen, "topP", "top_p"),
        max_tokens=pick(gen, "maxOutputTokens", "max_output_tokens"),
        json_schema=schema,
        wants_json=pick(gen, "responseMimeType", "response_mime_type") == "application/json",
        tools=list(body.get("tools") or []),
        web_search=any(
            "googleSearch" in t or "google_search" in t for t in body.get("tools") or []
        ),
    )


def encode(reply: Reply, request: AgentRequest) -> dict[str, Any]:
    inp, out = usage(reply, request)
    candidate: dict[str, Any] = {"finishReason": _FINISH[reply.finish_reason], "index": 0}
    if reply.finish_reason != "refusal":
        candidate["content"] = {"role": "model", "parts": [{"text": reply.text}]}
    citations = cited(reply, request)
    if citations:
        candidate["groundingMetadata"] = {
            "webSearchQueries": [search_query(request)],
            "groundingChunks": [{"web": {"uri": c.url, "title": c.title}} for c in citations],
            "groundingSupports": [
                {"segment": {"startIndex": 0, "endIndex": len(c.snippet), "text": c.snippet},
                 "groundingChunkIndices": [i]}
                for i, c in enumerate(citations)
                if c.snippet
            ],
        }
    return {
        "candidates": [candidate],
        "usageMetadata": {
            "promptTokenCount": inp,
            "candidatesTokenCount": out,
            "totalTokenCount": inp + out,
        },
        "modelVersion": request.model,
    }


def error(status: int, message: str) -> dict[str, Any]:
    return {
        "error": {
            "code": status,
            "message": message,
            "status": _STATUS.get(status, "UNKNOWN"),
        }
    }


GENERATE_CONTENT = Codec(decode, encode, error)
