"""OpenAI and OpenAI-compatible servers (vLLM and the like), through the official `openai` SDK.

The SDK's own retries are off (`max_retries=0`): Temporal retries, and a hidden SDK retry would
multiply attempts and hide the Retry-After the workflow should honour.

For `openai-compatible` agents (our served conductor on vLLM) the provider also asks for
per-token logprobs and token ids, which the GRPO trainer needs; a server that does not return
them just leaves those fields empty.

A call with web search goes through the Responses API instead of Chat Completions: that is
where OpenAI offers its `web_search` tool for current models (gpt-5, o-series, gpt-4.1), while
Chat Completions searches only with the dedicated `*-search-*` models. Calls without web search
keep the Chat Completions path, which every OpenAI-compatible server (vLLM) speaks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from conductor_engine.engine.contracts.agent_calls import Citation, Usage, unique_citations
from conductor_engine.engine.providers import errors
from conductor_engine.engine.providers.base import ClientCache, Completion, CompletionRequest
from conductor_engine.engine.providers.pool import AgentSpec, WebSearch
from conductor_engine.engine.providers.registry import Capabilities

if TYPE_CHECKING:
    import openai

CAPABILITIES = {
    "openai": Capabilities(
        structured_output=True,
        web_search_options=frozenset({"max_uses", "allowed_domains", "user_location"}),
    ),
    # vLLM and the like: no search tool; our served conductor's trained versions by name.
    "openai-compatible": Capabilities(structured_output=True, trained_versions="served"),
}

# vLLM writes each logprob token as "token_id:<id>" when asked with this extra body field,
# which is the only way to get exact ids back through the chat API on older vLLM versions.
_VLLM_TOKEN_ID_PREFIX = "token_id:"


def preload() -> None:
    """Import the SDK now (a worker's start) rather than in the first call; importing this
    module alone does not, so reading CAPABILITIES costs no SDK import."""
    import openai  # noqa: F401


def _build(spec: AgentSpec, key: str) -> openai.AsyncOpenAI:
    import openai

    return openai.AsyncOpenAI(
        api_key=key, base_url=spec.base_url, max_retries=0, timeout=spec.timeout_s
    )


_clients = ClientCache(_build)


def _sampling(spec: AgentSpec, request: CompletionRequest) -> dict[str, float]:
    """temperature and top_p, from the request or else the pool; unset ones are left out."""
    temperature = (
        request.temperature if request.temperature is not None else spec.params.temperature
    )
    top_p = request.top_p if request.top_p is not None else spec.params.top_p
    values = {"temperature": temperature, "top_p": top_p}
    return {k: v for k, v in values.items() if v is not None}


def _arguments(spec: AgentSpec, request: CompletionRequest) -> dict[str, Any]:
    """The chat.completions.create arguments; unset sampling values fall back to the pool's."""
    args: dict[str, Any] = {
        "model": spec.model,
        "messages": [{"role": m.role, "content": m.content} for m in request.messages],
    }
    args.update(_sampling(spec, request))
    if request.seed is not None:  # both take it: vLLM exactly, OpenAI on a best-effort basis
        args["seed"] = request.seed
    if spec.params.reasoning_effort is not None:
        args["reasoning_effort"] = spec.params.reasoning_effort
    if spec.provider == "openai":
        # OpenAI's reasoning models (gpt-5, o-series) reject `max_tokens`.
        args["max_completion_tokens"] = request.max_tokens
    else:
        # Older OpenAI-compatible servers know only `max_tokens`.
        args["max_tokens"] = request.max_tokens
        args["logprobs"] = True
        args["extra_body"] = _vllm_extras(spec, request)
    if request.json_schema is not None and spec.structured_output and "extra_body" not in args:
        args["response_format"] = {
            "type": "json_schema",
            "json_schema": {
                "name": request.schema_name,
                "schema": request.json_schema,
                # Non-strict: OpenAI's strict mode demands every property be required and
                # additionalProperties false, which our plan schema need not satisfy.
                "strict": False,
            },
        }
    return args


def _vllm_extras(spec: AgentSpec, request: CompletionRequest) -> dict[str, Any]:
    """vLLM's own request fields: the sampled token ids (`return_token_ids`, vLLM >= 0.10.2;
    `return_tokens_as_token_ids` for older servers, which spell ids into the logprob tokens),
    and the schema as vLLM's structured output rather than `response_format`.

    `structured_outputs.json` with `disable_any_whitespace` is what vLLM's xgrammar backend
    compiles with the call the local provider makes (compact JSON, grammar.compile_grammar), so
    a served conductor samples under the very grammar the trainer walks its ids through
    (engine/providers/local/reconstruct.py). `response_format` would leave whitespace free, and
    both at once are two constraints, which vLLM refuses."""
    extras: dict[str, Any] = {"return_token_ids": True, "return_tokens_as_token_ids": True}
    if request.json_schema is not None and spec.structured_output:
        extras["structured_outputs"] = {"json": request.json_schema,
                                        "disable_any_whitespace": True}
    return extras


def _token_data(choice: Any) -> tuple[list[int] | None, list[float] | None]:
    """Token ids and logprobs of the sampled tokens, when the server sent them.

    vLLM's newer `token_ids` field is used when present; otherwise ids are read from
    "token_id:<id>" logprob tokens. Anything unexpected yields None rather than an error: the
    text is still a valid answer, only unusable for training.
    """
    content = getattr(getattr(choice, "logprobs", None), "content", None)
    logprobs = [float(t.logprob) for t in content] if content else None
    direct = getattr(choice, "token_ids", None)
    if isinstance(direct, list) and all(isinstance(i, int) for i in direct):
        return direct, logprobs
    if not content:
        return None, logprobs
    ids: list[int] = []
    for item in content:
        token = getattr(item, "token", "")
        if not isinstance(token, str) or not token.startswith(_VLLM_TOKEN_ID_PREFIX):
            return None, logprobs
        try:
            ids.append(int(token[len(_VLLM_TOKEN_ID_PREFIX) :]))
        except ValueError:
            return None, logprobs
    return ids, logprobs


def _completion(spec: AgentSpec, response: Any) -> Completion:
    """Read the answer out of a ChatCompletion; raise if the body lacks what the API promises.

    The SDK builds response objects without validation, so a body missing `choices` arrives
    as an object whose fields are None: check rather than trust.
    """
    choices = getattr(response, "choices", None)
    if not choices:
        raise errors.malformed_response(spec, "no choices in the chat completion")
    choice = choices[0]
    message = getattr(choice, "message", None)
    if message is None:
        raise errors.malformed_response(spec, "the first choice has no message")
    refused = getattr(message, "refusal", None)
    if refused:
        raise errors.refusal(spec, str(refused))
    content = getattr(message, "content", None)
    finish_reason = getattr(choice, "finish_reason", None)
    if finish_reason == "content_filter" and not content:
        raise errors.refusal(spec, "the output was withheld by the content filter")
    if content is not None and not isinstance(content, str):
        raise errors.malformed_response(spec, "message content is not text")
    usage = getattr(response, "usage", None)
    token_ids, logprobs = (
        _token_data(choice) if spec.provider == "openai-compatible" else (None, None)
    )
    return Completion(
        text=content or "",
        usage=Usage(
            input_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            output_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        ),
        model=str(getattr(response, "model", None) or spec.model),
        finish_reason=finish_reason,
        token_ids=token_ids,
        logprobs=logprobs,
    )


def _web_search_tool(search: WebSearch) -> dict[str, Any]:
    """The Responses API's `web_search` tool with the pool's domain and location settings."""
    tool: dict[str, Any] = {"type": "web_search"}
    if search.allowed_domains:
        tool["filters"] = {"allowed_domains": list(search.allowed_domains)}
    if search.user_location is not None:
        where = search.user_location.model_dump(exclude_none=True)
        tool["user_location"] = {"type": "approximate", **where}
    return tool


def _response_arguments(
    spec: AgentSpec, request: CompletionRequest, search: WebSearch
) -> dict[str, Any]:
    """responses.create arguments for a call with web search; sampling as in `_arguments`."""
    args: dict[str, Any] = {
        "model": spec.model,
        "input": [{"role": m.role, "content": m.content} for m in request.messages],
        "max_output_tokens": request.max_tokens,
        "tools": [_web_search_tool(search)],
        # Nothing here chains responses, so nothing needs keeping on OpenAI's servers.
        "store": False,
    }
    args.update(_sampling(spec, request))
    if spec.params.reasoning_effort is not None:
        args["reasoning"] = {"effort": spec.params.reasoning_effort}
    if search.max_uses is not None:
        args["max_tool_calls"] = search.max_uses  # web search is the only tool offered
    if request.json_schema is not None and spec.structured_output:
        args["text"] = {
            "format": {
                "type": "json_schema",
                "name": request.schema_name,
                "schema": request.json_schema,
                "strict": False,
            }
        }
    return args


# Why a Responses API answer stopped early, in the engine's finish-reason vocabulary.
_INCOMPLETE = {"max_output_tokens": "length", "content_filter": "content_filter"}


def _message_parts(response: Any) -> tuple[str, list[str], list[Citation]]:
    """(answer text, refusals, url citations) from the response's output messages; search
    calls and reasoning items between them are not the answer."""
    texts: list[str] = []
    refusals: list[str] = []
    citations: list[Citation] = []
    for item in response.output:
        if getattr(item, "type", None) != "message":
            continue
        for part in item.content or []:
            kind = getattr(part, "type", None)
            if kind == "refusal":
                refusals.append(str(part.refusal))
            elif kind == "output_text":
                texts.append(str(part.text))
                citations += [
                    Citation(url=str(a.url), title=str(getattr(a, "title", None) or ""))
                    for a in part.annotations or []
                    if getattr(a, "type", None) == "url_citation"
                ]
    return "".join(texts), refusals, citations


def _response_completion(spec: AgentSpec, response: Any) -> Completion:
    """Read the answer and its citations out of a Responses API response; raise if the body
    lacks what the API promises (the SDK does not validate it)."""
    if getattr(response, "output", None) is None or getattr(response, "usage", None) is None:
        raise errors.malformed_response(spec, "the response has no output or no usage")
    status = getattr(response, "status", None)
    if status == "failed":
        error = getattr(response, "error", None)
        raise errors.malformed_response(
            spec, f"the response failed: {getattr(error, 'message', None) or 'no reason given'}"
        )
    text, refusals, citations = _message_parts(response)
    reason = getattr(getattr(response, "incomplete_details", None), "reason", None)
    if not text and (refusals or reason == "content_filter"):
        raise errors.refusal(spec, " ".join(refusals) or "the output was withheld by the filter")
    return Completion(
        text=text,
        usage=Usage(
            input_tokens=int(getattr(response.usage, "input_tokens", 0) or 0),
            output_tokens=int(getattr(response.usage, "output_tokens", 0) or 0),
        ),
        model=str(getattr(response, "model", None) or spec.model),
        finish_reason="stop" if status == "completed" else _INCOMPLETE.get(str(reason), reason),
        citations=unique_citations(citations),
    )


async def complete(spec: AgentSpec, request: CompletionRequest) -> Completion:
    """One chat completion (or one response, with web search), no retries; every failure
    becomes an AgentCallError."""
    import openai

    key = errors.require_api_key(spec)
    client = _clients.get(spec, key)
    search = request.web_search
    if search is not None:
        return await errors.call_sdk(
            openai, spec, key,
            lambda: client.responses.create(**_response_arguments(spec, request, search)),
            _response_completion,
        )
    return await errors.call_sdk(
        openai, spec, key, lambda: client.chat.completions.create(**_arguments(spec, request)),
        _completion,
    )
