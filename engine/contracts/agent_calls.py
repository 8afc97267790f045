"""What an agent call carries and reports, shared by every layer that handles one: the chat
messages, the task a call belongs to, the tokens it used and the web sources it cited. Provider
specifics (the request, the completion, errors) stay in engine/providers/base.py."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, Field


class Message(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str


class AnswerKey(BaseModel):
    """How the task's verifier reads its reference: the verifier that judges it ("auto"
    resolved) and, for a multiple-choice reference, the right letter. The agent activity sets it
    on a sim agent's TaskInfo from the verifiers themselves (engine/rewards), so a simulated
    answer is right or wrong exactly as the score will judge it, and the sim provider needs no
    verifier of its own."""

    verifier: str = Field(description="exact, choice, math or code")
    letter: str | None = Field(default=None, description="choice: the right letter")


class TaskInfo(BaseModel):
    """Which task and which rollout a call belongs to. Only the sim provider reads it (to be
    right or wrong repeatably, against the reference); every other provider ignores it, and no
    part of it but the id is ever logged or sent to a model."""

    task_id: str
    tags: list[str] = Field(default_factory=list)
    reference: str | None = None
    verifier: str | None = None
    sample: int = Field(default=0, ge=0, description="which rollout of a group (Task.sampling)")
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
    key: AnswerKey | None = Field(
        default=None, description="how the verifier reads the reference (set by the agent "
        "activity for a sim agent; None: the sim reads `verifier` as given, exact when unset)",
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
