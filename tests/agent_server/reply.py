"""What a test scripts the agent server to answer: `Reply`, and the responders that compute one
from a request's text."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from conductor_engine.engine.contracts.agent_calls import Citation

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


# A responder is given the request's text (every message, one per line) and answers with the
# reply's text, or with a whole Reply.
Responder = Callable[[str], "str | Reply"]


def echo_ok(_: str) -> str:
    """The default responder: "ok" to anything."""
    return "ok"
