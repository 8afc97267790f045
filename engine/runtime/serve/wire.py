"""The OpenAI wire shapes `conductor serve` reads and writes: a chat completion request, its
answer (whole, or as `chat.completion.chunk` events), the model list and the error body.

Only what the conductor can honour is read from a request; the many other OpenAI parameters
(`top_p`, `seed`, `tools`, ...) are accepted and ignored, as other OpenAI-compatible servers do,
so an existing client works unchanged. A message's content may be text or a list of text parts;
anything else (an image, audio) is a 400 that says so. Every field is typed (nothing is kept as
arbitrary JSON), so what a body nests inside fields the server ignores is parsed and dropped.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from conductor_engine.engine.runtime.serve.catalog import MAX_MODEL_NAME_CHARS


class ContentPart(BaseModel):
    """One part of a message's content; only text parts are read (`_text_only`)."""

    model_config = ConfigDict(extra="ignore")

    type: str | None = None
    text: str = ""


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None

    @field_validator("content")
    @classmethod
    def _text_only(cls, content: str | list[ContentPart] | None
                   ) -> str | list[ContentPart] | None:
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


class StreamOptions(BaseModel):
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
