"""The plan as a value: the steps a conductor wrote, who each step is for and which earlier steps
it may read. Parsing and checking the conductor's text is the plan language's job
(engine/plan/language.py); the value lives here because traces, tasks, agents and activities all
carry it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, Field

DEFAULT_MAX_STEPS = 5

PlanForm = Literal["reasoning", "bare"]
"""How a conductor answers under constrained decoding: a JSON object whose first field is its
free-text reasoning, then the steps (the paper's think-then-plan), or the bare steps."""

DEFAULT_REASONING_MAX_CHARS = 2000
"""The default bound on the reasoning before a JSON plan: room for a paragraph of thought
(about 500 tokens), short enough to leave the plan most of a typical token budget."""

Access = Literal["all"] | list[int]


def sees_label(sees: Sequence[int], access: Access | None = None) -> str:
    """Earlier steps as people read them: 1-based numbers ("1,3"), or "none". Given an access
    list of "all", the word "all" instead, for views that show what a step was granted rather
    than what that came to. The one place this label is written."""
    if access == "all":
        return "all"
    return ",".join(str(i + 1) for i in sees) or "none"


def dead_steps(sees: Sequence[Sequence[int]]) -> list[int]:
    """The steps (by index) whose output cannot reach the answer: the last step's output is the
    answer, a step's output reaches it only through a later step that sees it, so a step that
    no step on a path to the last one sees only costs. `sees` is each step's earlier steps
    (Step.sees), in order. A plan without them is right as often, for less."""
    live = {len(sees) - 1} if sees else set()
    for i in range(len(sees) - 1, -1, -1):
        if i in live:
            live.update(sees[i])
    return [i for i in range(len(sees)) if i not in live]


class Step(BaseModel):
    agent: str
    subtask: str
    access: Access = "all"

    def sees(self, index: int) -> list[int]:
        """The indices of the earlier steps this step (at position `index`) may read."""
        return list(range(index)) if self.access == "all" else sorted(set(self.access))

    def access_label(self) -> str:
        """This step's access list as people read it: "all", "none" or "1,3"."""
        return sees_label([] if self.access == "all" else sorted(set(self.access)), self.access)


class Plan(BaseModel):
    steps: list[Step] = Field(default_factory=list)

    def __len__(self) -> int:
        return len(self.steps)

    def dead_steps(self) -> list[int]:
        """Its steps no step on a path to the answer sees (`dead_steps`): a draft that the last
        step, given no access to it, never reads."""
        return dead_steps([s.sees(i) for i, s in enumerate(self.steps)])

    def to_paper_form(self) -> str:
        """The plan written back in the paper's list form (shown to the conductor in refinement)."""
        return (
            f"model_id = {json.dumps([s.agent for s in self.steps])}\n"
            f"subtasks = {json.dumps([s.subtask for s in self.steps])}\n"
            f"access_list = {json.dumps([s.access for s in self.steps])}"
        )
