"""What every provider takes and returns, and the one error type they raise.

Providers never retry: Temporal owns retries. A provider only classifies each failure as
retryable or not (and how long to wait), and the activity turns that into an ApplicationError.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Annotated, Any, Generic, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, Field

from conductor_engine.engine.providers.pool import WebSearch
from conductor_engine.engine.redaction import redact_text
from conductor_engine.engine.text import encodable

if TYPE_CHECKING:
    from conductor_engine.engine.providers.pool import AgentSpec

C = TypeVar("C")


class Message(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str


class TaskInfo(BaseModel):
    """Which task and which rollout a call belongs to. Only the sim provider reads it (to be
    right or wrong repeatably, against the reference); every other provider ignores it, and no
    part of it but the id is ever logged or sent to a model."""

    task_id: str
    tags: list[str] = Field(default_factory=list)
    reference: str | None = None
    verifier: str | None = None
    sample: int = Field(default=0, ge=0, description="which rollout of a group (RunOptions)")
    attempt: int = Field(default=1, ge=1, description="the activity attempt, from 1")
    parts: list[str] = Field(
        default_factory=list,
        description="a composite task's parts (Task.parts): one tag each, in the order its "
        "reference lists their answers",
    )
    seen: list[str] = Field(
        default_factory=list,
        description="the earlier answers this step may read (set by the agent activity for a "
        "sim agent, which reviews them)",
    )


class CompletionRequest(BaseModel):
    """One chat completion. `json_schema`, when set, asks the backend to constrain the output to
    that schema (structured outputs); backends that cannot do so ignore it."""

    messages: list[Message]
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int = 1024
    json_schema: dict[str, Any] | None = None
    schema_name: str = "plan"
    web_search: WebSearch | None = Field(
        default=None, description="turn on the provider's own web search tool for this call"
    )
    task: TaskInfo | None = Field(
        default=None, description="the task and rollout this call is for (the sim provider's)"
    )
    seed: int | None = Field(
        default=None, ge=0, description="seeds this call's sampling, so a rollout draws the same "
        "tokens whatever else the backend is generating (the local model: exactly; OpenAI and "
        "vLLM: passed as `seed`, best effort); None draws freshly",
    )


class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
        )


class Citation(BaseModel):
    """A web source the provider says the answer drew on, as the provider reported it.

    `snippet` is the passage tying the source to the answer where the provider gives one: the
    quoted source text (Anthropic) or the answer sentence the source supports (Gemini); OpenAI
    gives only positions of its inline links, so it has none.
    """

    url: str
    title: str = ""
    snippet: str | None = None


def unique_citations(citations: Iterable[Citation]) -> list[Citation]:
    """One citation per URL, in order of first citation: providers cite a source once per
    sentence it supports, and a report wants each source once."""
    seen: dict[str, Citation] = {}
    for c in citations:
        if c.url and c.url not in seen:
            seen[c.url] = c
    return list(seen.values())


class Completion(BaseModel):
    text: Annotated[str, AfterValidator(encodable)] = Field(
        description="the reply, made encodable (engine/text.py `encodable`) whatever the server "
        "sent")
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float = 0.0
    model: str = ""
    finish_reason: str | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    forced_positions: list[int] | None = Field(
        default=None, description="indices into token_ids of tokens a JSON grammar forced (it "
        "allowed no other); a trainer leaves them out of the loss",
    )
    choice_tokens: dict[int, list[int]] | None = Field(
        default=None, description="index into token_ids -> the few tokens a JSON grammar "
        "allowed there (a choice: which agent, which access); `logprobs` at those indices are "
        "renormalised over them, and a trainer scores them so",
    )
    citations: list[Citation] = Field(
        default_factory=list, description="web sources cited, when web search was on"
    )


class AgentCallError(Exception):
    """A failed call to an agent.

    `retryable` says whether Temporal should try again (429, 408, 409, 5xx, timeouts, connection
    errors); `retry_after` is the server's Retry-After in seconds when it sent one. The message
    names the agent and, for errors a person must fix, says what to do. It is redacted here, once
    for every provider: it quotes servers and URLs, and it goes into history.
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        retry_after: float | None = None,
        status: int | None = None,
        kind: str = "AgentCallError",
    ) -> None:
        message = redact_text(message)
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.retry_after = retry_after
        self.status = status
        self.kind = kind


RETRYABLE_STATUS = frozenset({408, 409, 429}) | frozenset(range(500, 600))


def is_retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUS


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the delta-seconds form; an HTTP date is ignored)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


class ClientCache(Generic[C]):
    """One SDK client per event loop and (base URL, key, timeout).

    Building a client costs tens of milliseconds (a TLS context), so hundreds of parallel steps
    must not build one each; an SDK client is bound to the loop it was made on. The key is part
    of the cache key only so that a changed environment variable takes effect on the next call.
    """

    def __init__(self, build: Callable[[AgentSpec, str], C]) -> None:
        self._build = build
        self._clients: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[tuple[str | None, str, float], C]
        ] = weakref.WeakKeyDictionary()

    def get(self, spec: AgentSpec, key: str) -> C:
        per_loop = self._clients.setdefault(asyncio.get_running_loop(), {})
        cache_key = (spec.base_url, key, spec.timeout_s)
        if cache_key not in per_loop:
            per_loop[cache_key] = self._build(spec, key)
        return per_loop[cache_key]
