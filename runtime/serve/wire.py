"""The OpenAI wire shapes `conductor serve` reads and writes: a chat completion request, its
answer (whole, or as `chat.completion.chunk` events), the model list and the error body.

Only what the conductor can honour is read from a request; the many other OpenAI parameters
(`top_p`, `seed`, `tools`, ...) are accepted and ignored, as other OpenAI-compatible servers do,
so an existing client works unchanged. A message's content may be text or a list of text parts;
anything else (an image, audio) is a 400 that says so. Every field is typed (nothing is kept as
arbitrary JSON), so what a body nests inside fields the server ignores is parsed and dropped.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from conductor_engine.runtime.serve.catalog import MAX_MODEL_NAME_CHARS

MAX_REQUEST_OBJECTS = 10_000
"""The most JSON objects a request may hold where the server reads them (messages, content
parts, `stream_options`). Each is a Python object built under the interpreter lock, and a
quarter of a million tiny messages in an 8 MiB body took seconds of CPU and garbage collection
(every other client waiting), for a task refused for its size anyway. Objects inside fields the
server ignores are never built, so they do not count."""


class TooManyObjects(Exception):
    """A request over MAX_REQUEST_OBJECTS. Not a ValueError, so that pydantic stops at once
    rather than validating (and rendering as an error's input) the rest."""


class _Counted(BaseModel):
    """A request object that counts itself against MAX_REQUEST_OBJECTS while a body is read
    by `read_chat_request` (the validation context holds the count). Counted once built: a
    validator run before would be handed its input as Python objects, all of them."""

    @model_validator(mode="after")
    def _count(self, info: ValidationInfo) -> Self:
        budget = info.context
        if isinstance(budget, _Budget):
            budget.objects += 1
            if budget.objects > MAX_REQUEST_OBJECTS:
                raise TooManyObjects
        return self


class _Budget:
    def __init__(self) -> None:
        self.objects = 0


class ContentPart(_Counted):
    """One part of a message's content; only text parts are read (`_text_only`)."""

    model_config = ConfigDict(extra="ignore")

    type: str | None = None
    text: str = ""


class ChatMessage(_Counted):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: list[ContentPart] | str | None = Field(default=None, union_mode="left_to_right")
    """The list is tried first: tried as a string first, a list of a million parts would be
    built whole as that failure's input before its count stopped it."""

    @field_validator("content")
    @classmethod
    def _text_only(cls, content: list[ContentPart] | str | None
                   ) -> list[ContentPart] | str | None:
        if isinstance(content, list):
            kinds = sorted({str(p.type) for p in content if p.type != "text"})
            if kinds:
                raise ValueError(f"the conductor reads text only; this message has "
                                 f"{', '.join(kinds)} parts")
        return content

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "\n".join(p.text for p in self.content)
        return self.content or ""


class StreamOptions(_Counted):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class ChatRequest(BaseModel):
    """POST /v1/chat/completions. `temperature` is the conductor's sampling temperature for
    its plan (RunOptions.temperature); the agents keep their pool settings."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, max_length=MAX_MODEL_NAME_CHARS)
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    user: str | None = None


def read_chat_request(body: bytes) -> ChatRequest:
    """The chat request in a JSON body: ValidationError for one that is not, TooManyObjects
    as soon as it passes MAX_REQUEST_OBJECTS."""
    return ChatRequest.model_validate_json(body, context=_Budget())


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class Choice(BaseModel):
    index: int = 0
    message: ResponseMessage
    finish_reason: Literal["stop"] = "stop"


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: Literal["stop"] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: CompletionUsage | None = None


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "conductor"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


ErrorType = Literal["invalid_request_error", "authentication_error", "not_found_error",
                    "server_error", "timeout_error"]


def error_body(message: str, kind: ErrorType, code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    """OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
