"""One scripted agent server for tests and benchmarks, speaking all three wire formats.

A real local HTTP server (stdlib, in a daemon thread) so the providers are tested through the
real SDKs, over real sockets: URL building, headers, timeouts, error classes and body parsing
are the SDKs' own. The three API families differ only in how a request is decoded and a reply
encoded; scripting, counting and recording are shared.

    with start_agent_server() as server:
        server.script("gpt-x", [Reply.error(429, retry_after=1), Reply.ok("42")])
        spec = server.spec("openai", "gpt-x", api_key_env="OPENAI_API_KEY")
        ...
        assert server.calls("gpt-x") == 2

Routes (what the SDKs request when given the base URLs below):
    OpenAI     POST /v1/chat/completions             base_url = server.openai_base_url (".../v1")
               POST /v1/responses                    (the Responses API: calls with web search)
    Anthropic  POST /v1/messages                     base_url = server.anthropic_base_url
    Gemini     POST /{v1,v1beta}/models/{m}:generateContent
                                                     base_url = server.gemini_base_url
(google-genai 3.x calls /v1/...; older releases called /v1beta/...; both are served.)
    vLLM LoRA  POST /v1/load_lora_adapter, /v1/unload_lora_adapter   (runtime LoRA, below)

Runtime LoRA, as vLLM started with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
answers it: a load is 200 the first time, 400 "has already been loaded" for a name it holds,
404 "No adapter found for PATH" for a directory that does not exist here; an unload of a name
it does not hold is 404. A chat completion for an adapter-style model name (`NAME-vK`) is 404
"The model `NAME-vK` does not exist." until that name is loaded. `vllm_lora(runtime_updating=
False)` makes the routes 404 "Not Found", as a server without runtime updating does;
`drop_adapters()` forgets every adapter, as a restarted vLLM does; `lora_calls()` records them.

Web search: a reply scripted with `citations` carries them in the family's own wire format (URL
citation annotations, `web_search_result_location` citations after a search's tool blocks,
`groundingMetadata`), but only when the request asked for the provider's web search tool, as a
real provider would; `AgentRequest.web_search` says whether it did.

A delayed reply notices the client hanging up (its timeout, or a cancelled call) and stops
waiting; `AgentRequest.hung_up` records that, so tests can see a call was really abandoned.
"""

from __future__ import annotations

import json
import re
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal, NamedTuple

import pytest
from conductor_engine.engine.providers.base import Citation
from conductor_engine.engine.providers.pool import AgentSpec

Api = Literal["openai", "responses", "anthropic", "gemini"]
FinishReason = Literal["stop", "length", "refusal"]


@dataclass(frozen=True)
class Reply:
    """One scripted answer. Use the constructors: `Reply.ok`, `Reply.error`, `Reply.malformed`,
    `Reply.refusal`; `.after(seconds)` delays any of them.

    `text` is the answer, or the error message when `status` is not 200. `body`, when set, is
    sent verbatim instead of an encoded reply. Token counts default to word counts.
    """

    text: str = "ok"
    status: int = 200
    body: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    input_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: FinishReason = "stop"
    token_ids: Sequence[int] | None = None  # OpenAI format only, vLLM style, when logprobs asked
    logprobs: Sequence[float] | None = None
    citations: Sequence[Citation] = ()  # sent only to a request that asked for web search

    @classmethod
    def ok(
        cls,
        text: str,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        finish_reason: FinishReason = "stop",
        token_ids: Sequence[int] | None = None,
        logprobs: Sequence[float] | None = None,
        citations: Sequence[Citation] = (),
    ) -> Reply:
        return cls(
            text=text,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            finish_reason=finish_reason,
            token_ids=token_ids,
            logprobs=logprobs,
            citations=tuple(citations),
        )

    @classmethod
    def error(
        cls,
        status: int,
        message: str = "scripted error",
        *,
        retry_after: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        """An HTTP error in the API family's own error envelope."""
        all_headers = dict(headers or {})
        if retry_after is not None:
            all_headers["Retry-After"] = f"{retry_after:g}"
        return cls(text=message, status=status, headers=all_headers)

    @classmethod
    def malformed(cls, kind: Literal["json", "fields"] = "json") -> Reply:
        """A 200 whose body is cut-off JSON ("json") or valid JSON lacking every field."""
        body = b'{"id": "cut-off", "choices": [' if kind == "json" else b'{"unexpected": true}'
        return cls(body=body)

    @classmethod
    def refusal(cls, text: str = "I can't help with that.") -> Reply:
        return cls(text=text, finish_reason="refusal")

    def after(self, seconds: float) -> Reply:
        """The same reply, sent only after `seconds` (a slow or hung agent)."""
        return replace(self, delay_s=seconds)


@dataclass
class AgentRequest:
    """A request as the server decoded it, the same shape whatever the API family.

    `messages` are plain text, system text first under role "system" (Anthropic and Gemini
    carry it outside the message list; here it is folded back in so tests compare alike).
    """

    api: Api
    model: str
    messages: list[dict[str, str]]
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    json_schema: dict[str, Any] | None = None
    wants_json: bool = False
    logprobs: bool = False
    api_key: str | None = None
    path: str = ""
    body: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] = field(default_factory=list)
    web_search: bool = False  # the provider's own web search tool was asked for
    hung_up: bool = False  # the client closed the connection before a delayed reply was sent

    @property
    def text(self) -> str:
        """Every message's text, one per line: what a responder reads."""
        return "\n".join(m["content"] for m in self.messages)

    @property
    def system(self) -> str:
        return "\n".join(m["content"] for m in self.messages if m["role"] == "system")


@dataclass(frozen=True)
class LoraCall:
    """One request to the runtime LoRA routes and the status it was answered with."""

    route: Literal["load", "unload"]
    lora_name: str | None
    lora_path: str | None
    api_key: str | None
    status: int


Responder = Callable[[str], "str | Reply"]


def _echo_ok(_: str) -> str:
    return "ok"


# ---------------------------------------------------------------- decoding: wire -> AgentRequest


def _plain(content: Any) -> str:
    """Text of a content field: a string, or a list of text parts/blocks (any family)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    if isinstance(content, dict):  # a Gemini Content: {"parts": [...]}
        return _plain(content.get("parts", []))
    return ""


def _decode_openai(body: dict[str, Any], model: str) -> AgentRequest:
    fmt = body.get("response_format") or {}
    schema = (
        (fmt.get("json_schema") or {}).get("schema") if fmt.get("type") == "json_schema" else None
    )
    return AgentRequest(
        api="openai",
        model=str(body.get("model", model)),
        messages=[
            {"role": str(m.get("role")), "content": _plain(m.get("content"))}
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


def _decode_responses(body: dict[str, Any], model: str) -> AgentRequest:
    """The Responses API: `input` is a string or a list of messages, system text may also come
    as `instructions`, and a JSON schema sits in `text.format`."""
    items = body.get("input") or []
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    instructions = body.get("instructions")
    messages = [{"role": "system", "content": str(instructions)}] if instructions else []
    messages += [
        {"role": str(m.get("role")), "content": _plain(m.get("content"))}
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


def _decode_anthropic(body: dict[str, Any], model: str) -> AgentRequest:
    system = _plain(body.get("system", ""))
    messages = [{"role": "system", "content": system}] if system else []
    messages += [
        {"role": str(m.get("role")), "content": _plain(m.get("content"))}
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


def _decode_gemini(body: dict[str, Any], model: str) -> AgentRequest:
    def pick(d: dict[str, Any], camel: str, snake: str) -> Any:
        return d.get(camel, d.get(snake))

    system = _plain(pick(body, "systemInstruction", "system_instruction") or "")
    messages = [{"role": "system", "content": system}] if system else []
    messages += [
        {
            "role": "assistant" if c.get("role") == "model" else "user",
            "content": _plain(c.get("parts", [])),
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


# ---------------------------------------------------------------- encoding: Reply -> wire


def _usage(reply: Reply, request: AgentRequest) -> tuple[int, int]:
    inp = reply.input_tokens if reply.input_tokens is not None else len(request.text.split())
    out = reply.output_tokens if reply.output_tokens is not None else len(reply.text.split())
    return inp, out


def _encode_openai(reply: Reply, request: AgentRequest) -> dict[str, Any]:
    inp, out = _usage(reply, request)
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


def _cited(reply: Reply, request: AgentRequest) -> Sequence[Citation]:
    """The reply's citations if the request searched the web (a real provider cites nothing
    it did not search for)."""
    return reply.citations if request.web_search else ()


def _query(request: AgentRequest) -> str:
    """The search query a scripted search pretends to have run: the start of the prompt."""
    return " ".join(request.messages[-1]["content"].split()[:12]) if request.messages else ""


def _encode_responses(reply: Reply, request: AgentRequest) -> dict[str, Any]:
    inp, out = _usage(reply, request)
    cited = _cited(reply, request)
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
                for c in cited
            ],
        }
    output: list[dict[str, Any]] = []
    if cited:
        output.append({
            "type": "web_search_call", "id": "ws_scripted", "status": "completed",
            "action": {"type": "search", "query": _query(request)},
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


_ANTHROPIC_STOP = {"stop": "end_turn", "length": "max_tokens", "refusal": "refusal"}


def _anthropic_content(reply: Reply, request: AgentRequest) -> list[dict[str, Any]]:
    """A text block; after a search, the server tool's blocks first and citations on the text."""
    cited = _cited(reply, request)
    if not cited:
        return [{"type": "text", "text": reply.text}]
    search = {
        "type": "server_tool_use", "id": "srvtoolu_scripted", "name": "web_search",
        "input": {"query": _query(request)},
    }
    results = {
        "type": "web_search_tool_result",
        "tool_use_id": "srvtoolu_scripted",
        "content": [
            {"type": "web_search_result", "url": c.url, "title": c.title,
             "encrypted_content": "scripted", "page_age": None}
            for c in cited
        ],
    }
    citations = [
        {"type": "web_search_result_location", "url": c.url, "title": c.title,
         "cited_text": c.snippet or "", "encrypted_index": "scripted"}
        for c in cited
    ]
    return [search, results, {"type": "text", "text": reply.text, "citations": citations}]


def _encode_anthropic(reply: Reply, request: AgentRequest) -> dict[str, Any]:
    inp, out = _usage(reply, request)
    refused = reply.finish_reason == "refusal"
    return {
        "id": "msg_scripted",
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": [] if refused else _anthropic_content(reply, request),
        "stop_reason": _ANTHROPIC_STOP[reply.finish_reason],
        "stop_sequence": None,
        "usage": {"input_tokens": inp, "output_tokens": out},
    }


_GEMINI_FINISH = {"stop": "STOP", "length": "MAX_TOKENS", "refusal": "SAFETY"}


def _encode_gemini(reply: Reply, request: AgentRequest) -> dict[str, Any]:
    inp, out = _usage(reply, request)
    candidate: dict[str, Any] = {"finishReason": _GEMINI_FINISH[reply.finish_reason], "index": 0}
    if reply.finish_reason != "refusal":
        candidate["content"] = {"role": "model", "parts": [{"text": reply.text}]}
    cited = _cited(reply, request)
    if cited:
        candidate["groundingMetadata"] = {
            "webSearchQueries": [_query(request)],
            "groundingChunks": [{"web": {"uri": c.url, "title": c.title}} for c in cited],
            "groundingSupports": [
                {"segment": {"startIndex": 0, "endIndex": len(c.snippet), "text": c.snippet},
                 "groundingChunkIndices": [i]}
                for i, c in enumerate(cited)
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


_ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
_GEMINI_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def _error_openai(status: int, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "scripted_error", "param": None, "code": None}}


def _error_anthropic(status: int, message: str) -> dict[str, Any]:
    kind = _ANTHROPIC_ERRORS.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _error_gemini(status: int, message: str) -> dict[str, Any]:
    return {
        "error": {
            "code": status,
            "message": message,
            "status": _GEMINI_STATUS.get(status, "UNKNOWN"),
        }
    }


class _Codec(NamedTuple):
    decode: Callable[[dict[str, Any], str], AgentRequest]
    encode: Callable[[Reply, AgentRequest], dict[str, Any]]
    error: Callable[[int, str], dict[str, Any]]


_CODECS: dict[Api, _Codec] = {
    "openai": _Codec(_decode_openai, _encode_openai, _error_openai),
    "responses": _Codec(_decode_responses, _encode_responses, _error_openai),
    "anthropic": _Codec(_decode_anthropic, _encode_anthropic, _error_anthropic),
    "gemini": _Codec(_decode_gemini, _encode_gemini, _error_gemini),
}
_GEMINI_PATH = re.compile(r"^/v1(?:beta|alpha)?/models/(?P<model>[^/:]+):generateContent$")


def _route(path: str) -> tuple[Api, str] | None:
    """(API family, model from the path or "") for a request path, None if not served."""
    if path == "/v1/chat/completions":
        return "openai", ""
    if path == "/v1/responses":
        return "responses", ""
    if path == "/v1/messages":
        return "anthropic", ""
    match = _GEMINI_PATH.match(path)
    if match:
        return "gemini", match["model"]
    return None


def _api_key(headers: Mapping[str, str], query: str) -> str | None:
    auth = headers.get("authorization") or ""
    if auth.lower().startswith("bearer "):
        return auth[7:]
    found = headers.get("x-api-key") or headers.get("x-goog-api-key")
    if found:
        return found
    match = re.search(r"(?:^|&)key=([^&]+)", query)
    return match[1] if match else None


# ---------------------------------------------------------------- vLLM's runtime LoRA routes

_LORA_ROUTES: dict[str, Literal["load", "unload"]] = {
    "/v1/load_lora_adapter": "load", "/v1/unload_lora_adapter": "unload",
}
_ADAPTER_NAME = re.compile(r"-v\d+$")  # engine.policies.served_name: NAME-vK


def _vllm_error(status: int, message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


# ---------------------------------------------------------------- the server


@dataclass
class _Script:
    queue: deque[Reply] = field(default_factory=deque)
    last: Reply | None = None
    then: Responder | None = None


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    agents: AgentServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the SDKs' connection pools expect
    disable_nagle_algorithm = True  # reply at once: no ~40 ms Nagle/delayed-ACK stall
    server: _HttpServer

    def do_POST(self) -> None:
        self.server.agents._handle(self)

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: the tests' output is for the tests."""


class AgentServer:
    """The scripted server. Thread-safe: the SDKs may call it from many steps at once."""

    def __init__(self, default_reply: Responder = _echo_ok) -> None:
        self.default_reply = default_reply
        self._lock = threading.Lock()
        self._scripts: dict[str, _Script] = {}
        self._requests: list[AgentRequest] = []
        self._adapters: dict[str, str] = {}  # runtime LoRA: name -> path
        self._lora_calls: list[LoraCall] = []
        self._runtime_lora = True
        self._lora_delay_s = 0.0
        self._closing = threading.Event()
        self._http = _HttpServer(("127.0.0.1", 0), _Handler)
        self._http.agents = self
        self._thread = threading.Thread(
            target=self._http.serve_forever, name="agent-server", daemon=True
        )

    # -- lifecycle

    def start(self) -> AgentServer:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving; delayed replies still waiting are cut short."""
        self._closing.set()
        self._http.shutdown()
        self._http.server_close()

    def __enter__(self) -> AgentServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- addresses

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def openai_base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.url

    @property
    def gemini_base_url(self) -> str:
        return self.url

    def base_url_for(self, provider: str) -> str:
        """The base URL an AgentSpec of this provider should use to reach this server."""
        if provider in ("openai", "openai-compatible"):
            return self.openai_base_url
        if provider == "anthropic":
            return self.anthropic_base_url
        if provider == "google":
            return self.gemini_base_url
        raise ValueError(f"the agent server does not speak provider {provider!r}")

    def spec(self, provider: str, model: str, **fields: Any) -> AgentSpec:
        """An AgentSpec aimed at this server; `fields` override anything (id, timeout_s, ...)."""
        values: dict[str, Any] = {
            "id": f"{provider}-{model}",
            "provider": provider,
            "model": model,
            "base_url": self.base_url_for(provider),
        }
        values.update(fields)
        return AgentSpec.model_validate(values)

    # -- scripting

    def script(
        self, model: str, replies: Sequence[Reply | str], *, then: Responder | None = None
    ) -> None:
        """Answer the next calls for `model` with `replies` in order; afterwards call `then`
        with the request text if given, else repeat the last reply. Replaces any earlier script.
        """
        queue = deque(r if isinstance(r, Reply) else Reply.ok(r) for r in replies)
        with self._lock:
            self._scripts[model] = _Script(queue=queue, then=then)

    def set_responder(self, model: str, fn: Responder) -> None:
        """Answer every call for `model` with fn(request_text): a str, or a Reply."""
        self.script(model, [], then=fn)

    def calls(self, model: str | None = None) -> int:
        """Requests received for `model` (all models if None), counted on arrival."""
        with self._lock:
            return sum(1 for r in self._requests if model is None or r.model == model)

    def requests(self, model: str | None = None) -> list[AgentRequest]:
        with self._lock:
            return [r for r in self._requests if model is None or r.model == model]

    def reset(self) -> None:
        """Forget every script, responder and recorded request (and every LoRA adapter)."""
        with self._lock:
            self._scripts.clear()
            self._requests.clear()
            self._adapters.clear()
            self._lora_calls.clear()
            self._runtime_lora, self._lora_delay_s = True, 0.0

    # -- runtime LoRA (vLLM)

    def vllm_lora(self, *, runtime_updating: bool = True, load_delay_s: float = 0.0) -> None:
        """Serve the LoRA routes (or 404 them, as vLLM without runtime updating); each load
        takes `load_delay_s` (so concurrent loads overlap)."""
        with self._lock:
            self._runtime_lora, self._lora_delay_s = runtime_updating, load_delay_s

    def lora_calls(self, route: Literal["load", "unload"] | None = None) -> list[LoraCall]:
        with self._lock:
            return [c for c in self._lora_calls if route is None or c.route == route]

    def adapters(self) -> dict[str, str]:
        """The adapters loaded now: name -> path."""
        with self._lock:
            return dict(self._adapters)

    def drop_adapters(self) -> None:
        """Forget every loaded adapter, as a restarted vLLM does."""
        with self._lock:
            self._adapters.clear()

    def _lora(self, route: Literal["load", "unload"], body: dict[str, Any],
              api_key: str | None) -> tuple[int, bytes | dict[str, Any]]:
        name, path = body.get("lora_name"), body.get("lora_path")
        if route == "load" and self._lora_delay_s > 0:
            self._closing.wait(self._lora_delay_s)
        with self._lock:
            status, payload = self._lora_answer(route, name, path)
            self._lora_calls.append(LoraCall(route, name, path, api_key, status))
        return status, payload

    def _lora_answer(self, route: Literal["load", "unload"], name: str | None,
                     path: str | None) -> tuple[int, bytes | dict[str, Any]]:
        """vLLM's answer (OpenAIServingModels.load_lora_adapter / unload_lora_adapter)."""
        if not self._runtime_lora:
            return 404, {"detail": "Not Found"}
        if route == "unload":
            if name not in self._adapters:
                return 404, _vllm_error(404, f"The lora adapter '{name}' cannot be found.",
                                        "NotFoundError")
            del self._adapters[name]
            return 200, f"Success: LoRA adapter '{name}' removed successfully.".encode()
        if not name or not path:
            return 400, _vllm_error(400, "Both 'lora_name' and 'lora_path' must be provided.",
                                    "InvalidUserInput")
        if name in self._adapters:
            return 400, _vllm_error(
                400, f"The lora adapter '{name}' has already been loaded. If you want to load "
                "the adapter in place, set 'load_inplace' to True.", "InvalidUserInput")
        if not Path(path).is_dir():
            return 404, _vllm_error(
                404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError")
        self._adapters[name] = path
        return 200, f"Success: LoRA adapter '{name}' added successfully.".encode()

    def _unknown_adapter(self, request: AgentRequest) -> bool:
        """A chat completion for an adapter name vLLM does not hold (recorded all the same)."""
        if request.api != "openai" or not _ADAPTER_NAME.search(request.model):
            return False
        with self._lock:
            if request.model in self._adapters:
                return False
            self._requests.append(request)
        return True

    def _next_reply(self, request: AgentRequest) -> Reply:
        """Record the request and choose its reply (responders run outside the lock)."""
        with self._lock:
            self._requests.append(request)
            script = self._scripts.get(request.model)
            if script is not None and script.queue:
                script.last = script.queue.popleft()
                return script.last
            if script is not None and script.then is None and script.last is not None:
                return script.last
            fn = script.then if script is not None and script.then else self.default_reply
        answer = fn(request.text)
        return answer if isinstance(answer, Reply) else Reply.ok(answer)

    # -- HTTP

    def _handle(self, h: _Handler) -> None:
        path, _, query = h.path.partition("?")
        length = int(h.headers.get("content-length") or 0)
        raw = h.rfile.read(length) if length else b""
        if path in _LORA_ROUTES:
            try:
                lora_body = json.loads(raw or b"{}")
            except json.JSONDecodeError:
                lora_body = {}
            key = _api_key({k.lower(): v for k, v in h.headers.items()}, query)
            status, lora_payload = self._lora(_LORA_ROUTES[path], lora_body, key)
            self._send(h, status, lora_payload, {})
            return
        route = _route(path)
        if route is None:
            self._send(h, 404, {"error": {"message": f"no route for POST {path}"}}, {})
            return
        api, path_model = route
        codec = _CODECS[api]
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            self._send(h, 400, codec.error(400, "request body is not JSON"), {})
            return
        request = codec.decode(body, path_model)
        request.api_key = _api_key({k.lower(): v for k, v in h.headers.items()}, query)
        request.path, request.body = path, body
        if self._unknown_adapter(request):
            self._send(h, 404, _vllm_error(
                404, f"The model `{request.model}` does not exist.", "NotFoundError"), {})
            return
        reply = self._next_reply(request)
        if reply.delay_s > 0 and self._wait(h, request, reply.delay_s):
            return
        if reply.body is not None:
            payload: bytes | dict[str, Any] = reply.body
        elif reply.status != 200:
            payload = codec.error(reply.status, reply.text)
        else:
            payload = codec.encode(reply, request)
        self._send(h, reply.status, payload, reply.headers)

    def _wait(self, h: _Handler, request: AgentRequest, seconds: float) -> bool:
        """Hold a delayed reply; True (send nothing) if the server closes or the client hangs
        up first, which is recorded on the request."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self._closing.wait(min(left, 0.05)):
                return True
            if _hung_up(h.connection):
                with self._lock:
                    request.hung_up = True
                h.close_connection = True
                return True
        return False

    @staticmethod
    def _send(
        h: _Handler, status: int, payload: bytes | dict[str, Any], headers: Mapping[str, str]
    ) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        try:
            h.send_response(status)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                h.send_header(name, value)
            h.end_headers()
            h.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (its timeout passed while this reply was delayed).
            h.close_connection = True


def _hung_up(conn: socket.socket) -> bool:
    """Whether the client closed its end: readable with nothing to read (clients here send
    nothing more on a connection while they await its reply)."""
    try:
        readable, _, _ = select.select([conn], [], [], 0)
        return bool(readable) and conn.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


@contextmanager
def start_agent_server(default_reply: Responder = _echo_ok) -> Iterator[AgentServer]:
    """A started server for the length of a `with` block (benchmarks, scripts)."""
    server = AgentServer(default_reply).start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def agent_server() -> Iterator[AgentServer]:
    """One server for the whole session; each test calls `agent_server.reset()` as it needs."""
    with start_agent_server() as server:
        yield server
