"""What every provider takes and returns, and the one error type they raise.

Providers never retry: Temporal owns retries. A provider only classifies each failure as
retryable or not (and how long to wait), and the activity turns that into an ApplicationError.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Generic, TypeVar

from pydantic import AfterValidator, BaseModel, Field

from conductor_engine.engine.contracts.agent_calls import Citation, Message, TaskInfo, Usage
from conductor_engine.engine.providers.pool import WebSearch
from conductor_engine.engine.redaction import redact_text
from conductor_engine.engine.text import encodable

if TYPE_CHECKING:
    from conductor_engine.engine.providers.pool import AgentSpec

C = TypeVar("C")


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
    explore: float = Field(
        default=0.0, ge=0.0, lt=1.0, description="a training rollout's exploration (the local "
        "model under a JSON schema only): each decision of the output (a choice right after "
        "forced text) is drawn uniformly over the allowed tokens with this probability "
        "(engine/providers/local/grammar.py)",
    )
    explore_importance: bool = Field(
        default=False, description="log-probs at an exploring request's decisions are the "
        "mixture's, not the policy's (engine/providers/local/sampling.py)",
    )
    force_shape: str | None = Field(
        default=None, description="a training rollout's forced plan shape, e.g. "
        "'more,sees,end' (the local model under a JSON schema only: "
        "engine/providers/local/shaping.py)",
    )
    force_agent: str | None = Field(
        default=None, description="a warm-up sample's forced first-step agent, a pool id (the "
        "local model under a JSON schema only: engine/providers/local/shaping.py)",
    )


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
