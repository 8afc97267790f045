"""What every API family's codec has in common: the decoded request (`AgentRequest`, the same
shape whatever the wire format), the `Codec` triple each family module provides, and the helpers
their encoders share.

A codec is three functions:
    decode(body, model_from_path) -> AgentRequest   the request's JSON body, decoded
    encode(reply, request) -> dict                  a 200 reply, in the family's format
    error(status, message) -> dict                  an error, in the family's error envelope
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from conductor_engine.engine.contracts.agent_calls import Citation
from tests.agent_server.reply import Reply

Api = Literal["openai", "responses", "anthropic", "gemini"]


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
    billed: bool = False  # a well-formed 200 answer was written to the client: a provider bills it

    @property
    def text(self) -> str:
        """Every message's text, one per line: what a responder reads."""
        return "\n".join(m["content"] for m in self.messages)

    @property
    def system(self) -> str:
        return "\n".join(m["content"] for m in self.messages if m["role"] == "system")


class Codec(NamedTuple):
    decode: Callable[[dict[str, Any], str], AgentRequest]
    encode: Callable[[Reply, AgentRequest], dict[str, Any]]
    error: Callable[[int, str], dict[str, Any]]


# ---------------------------------------------------------------- helpers the codecs share


def plain(content: Any) -> str:
    """Text of a content field: a string, or a list of text parts/blocks (any family)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    if isinstance(content, dict):  # a Gemini Content: {"parts": [...]}
        return plain(content.get("parts", []))
    return ""


def usage(reply: Reply, request: AgentRequest) -> tuple[int, int]:
    """(input, output) tokens: the reply's own counts, else the words of prompt and answer."""
    inp = reply.input_tokens if reply.input_tokens is not None else len(request.text.split())
    out = reply.output_tokens if reply.output_tokens is not None else len(reply.text.split())
    return inp, out


def cited(reply: Reply, request: AgentRequest) -> Sequence[Citation]:
    """The reply's citations if the request searched the web (a real provider cites nothing
    it did not search for)."""
    return reply.citations if request.web_search else ()


def search_query(request: AgentRequest) -> str:
    """The search query a scripted search pretends to have run: the start of the prompt."""
    return " ".join(request.messages[-1]["content"].split()[:12]) if request.messages else ""
