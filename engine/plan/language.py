"""The plan language: what the conductor writes, how it is parsed, and what makes it valid.

Two forms are accepted. The paper's form is free reasoning followed by three Python lists:

    model_id = ["gpt-5", "claude-sonnet-4"]
    subtasks = ["Solve the problem.", "Check the solution and give the final answer."]
    access_list = [[], "all"]

The JSON form (what constrained decoding produces) is `{"steps": [{"agent", "subtask",
"access"}, ...]}` or just the list of step objects. Access entries are `"all"` (every earlier
step), `[]` (none) or a list of 0-based indices of earlier steps.

Every failure raises PlanError with a message that says exactly what is wrong: that text is
recorded in the run, shown to the conductor on its next attempt, and scores 0 as a reward.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Collection, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

DEFAULT_MAX_STEPS = 5

Access = Literal["all"] | list[int]


class PlanError(ValueError):
    """The conductor's text is not a usable plan; str(error) says why."""


def saw_label(saw: Sequence[int], access: Access | None = None) -> str:
    """Earlier steps as people read them: 1-based numbers ("1,3"), or "none". Given an access
    list of "all", the word "all" instead, for views that show what a step was granted rather
    than what that came to. The one place this label is written."""
    if access == "all":
        return "all"
    return ",".join(str(i + 1) for i in saw) or "none"


class Step(BaseModel):
    agent: str
    subtask: str
    access: Access = "all"

    def sees(self, index: int) -> list[int]:
        """The indices of the earlier steps this step (at position `index`) may read."""
        return list(range(index)) if self.access == "all" else sorted(set(self.access))

    def access_label(self) -> str:
        """This step's access list as people read it: "all", "none" or "1,3"."""
        return saw_label([] if self.access == "all" else sorted(set(self.access)), self.access)


class Plan(BaseModel):
    steps: list[Step] = Field(default_factory=list)

    def __len__(self) -> int:
        return len(self.steps)

    def to_paper_form(self) -> str:
        """The plan written back in the paper's list form (shown to the conductor in refinement)."""
        return (
            f"model_id = {json.dumps([s.agent for s in self.steps])}\n"
            f"subtasks = {json.dumps([s.subtask for s in self.steps])}\n"
            f"access_list = {json.dumps([s.access for s in self.steps])}"
        )


# --- text clean-up -------------------------------------------------------------------------

_SMART = str.maketrans({"\u201c": '"', "\u201d": '"', "\u201e": '"', "\u2018": "'", "\u2019": "'"})
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"^\s*```[A-Za-z0-9_-]*\s*$", re.MULTILINE)
_LIST_NAMES = ("model_id", "subtasks", "access_list")
_ASSIGN = re.compile(r"\b(model_id|subtasks|access_list)\s*[:=]\s*(?=\[)")


def _clean(text: str) -> str:
    text = text.translate(_SMART)
    text = _THINK.sub("", text)
    if "</think>" in text.lower():  # an opening tag consumed by the chat template
        text = re.split(r"</think>", text, flags=re.IGNORECASE)[-1]
    return _FENCE.sub("", text)


def _bracketed(text: str, start: int) -> str | None:
    """The balanced `[...]` literal starting at `start`, respecting quoted strings."""
    depth, quote, escaped = 0, "", False
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return None


def _literal(name: str, source: str) -> list[Any]:
    if name == "access_list":  # tolerate a bare `all`
        source = re.sub(r"(?<![\"'\w])all(?![\"'\w])", '"all"', source)
    try:
        value = ast.literal_eval(source)
    except (ValueError, SyntaxError) as e:
        raise PlanError(f"{name} is not a valid Python list literal: {e}") from e
    if not isinstance(value, list):
        raise PlanError(f"{name} must be a list")
    return value


# --- the two forms ---------------------------------------------------------------------------


def _parse_list_form(text: str) -> dict[str, list[Any]] | None:
    found: dict[str, list[Any]] = {}
    for m in _ASSIGN.finditer(text):  # later assignments win: reasoning may show drafts
        literal = _bracketed(text, m.end())
        if literal is None:
            raise PlanError(f"{m.group(1)} opens a list that is never closed")
        found[m.group(1)] = _literal(m.group(1), literal)
    if not found:
        return None
    missing = [n for n in _LIST_NAMES if n not in found]
    if missing:
        raise PlanError(
            f"missing {', '.join(missing)}; write all three lists: model_id = [...], "
            f"subtasks = [...], access_list = [...]"
        )
    return found


def _json_candidates(text: str) -> list[Any]:
    # strict=False: raw control characters inside strings, which JSON forbids but grammar-
    # constrained decoders (xgrammar) let a model write, do not cost a whole plan
    decoder, out = json.JSONDecoder(strict=False), []
    i = 0
    while i < len(text):
        if text[i] in "[{":
            try:
                value, end = decoder.raw_decode(text, i)
            except json.JSONDecodeError:
                i += 1
                continue
            out.append(value)
            i = end
        else:
            i += 1
    return out


def _parse_json_form(text: str) -> dict[str, list[Any]] | None:
    for value in reversed(_json_candidates(text)):
        steps = value.get("steps") if isinstance(value, dict) else value
        if isinstance(steps, list) and all(isinstance(s, dict) for s in steps):
            if isinstance(value, list) and not steps:
                continue  # a bare [] is more likely an access list than a plan
            return {
                "model_id": [s.get("agent", s.get("model_id", s.get("model"))) for s in steps],
                "subtasks": [s.get("subtask", s.get("task")) for s in steps],
                "access_list": [s.get("access", s.get("access_list", "all")) for s in steps],
            }
    return None


# --- validation ------------------------------------------------------------------------------


def _validate(
    lists: dict[str, list[Any]],
    agent_ids: Sequence[str] | None,
    max_steps: int,
    allow_empty: bool,
) -> Plan:
    agents, subtasks, access = lists["model_id"], lists["subtasks"], lists["access_list"]
    if not (len(agents) == len(subtasks) == len(access)):
        raise PlanError(
            f"model_id has {len(agents)} entries, subtasks has {len(subtasks)} and access_list "
            f"has {len(access)}; all three lists must have the same length"
        )
    if not agents and not allow_empty:
        raise PlanError("the plan has no steps; give at least one step")
    if len(agents) > max_steps:
        raise PlanError(f"the plan has {len(agents)} steps; at most {max_steps} are allowed")
    steps = []
    for i, (agent, subtask, acc) in enumerate(zip(agents, subtasks, access, strict=True)):
        where = f"step {i} (0-based)"
        agent = _agent_id(agent, agent_ids, where)
        if agent_ids is not None and agent not in agent_ids:
            raise PlanError(
                f"{where}: unknown agent {agent!r}; choose one of: {', '.join(sorted(agent_ids))}"
            )
        if not isinstance(subtask, str) or not subtask.strip():
            raise PlanError(f"{where}: the subtask must be a non-empty string, got {subtask!r}")
        steps.append(Step(agent=agent, subtask=subtask.strip(), access=_access(acc, i, where)))
    return Plan(steps=steps)


def _agent_id(agent: Any, agent_ids: Sequence[str] | None, where: str) -> str:
    """An agent named by id, or by its position in the pool listing (the paper's integers)."""
    if type(agent) is int and agent_ids is not None:
        if not 0 <= agent < len(agent_ids):
            raise PlanError(
                f"{where}: agent number {agent} is out of range; the pool has "
                f"{len(agent_ids)} agents, numbered 0..{len(agent_ids) - 1}"
            )
        return agent_ids[agent]
    if not isinstance(agent, str) or not agent.strip():
        raise PlanError(f"{where}: the agent must be a non-empty string, got {agent!r}")
    return agent.strip()


def _access(acc: Any, index: int, where: str) -> Access:
    if acc == "all":
        return "all"
    if not isinstance(acc, list) or not all(type(j) is int for j in acc):
        raise PlanError(
            f'{where}: access must be "all", [] or a list of earlier step indices, got {acc!r}'
        )
    bad = [j for j in acc if not 0 <= j < index]
    if bad:
        allowed = f"0..{index - 1}" if index else "none (it is the first step; use [])"
        raise PlanError(
            f"{where}: access {acc} names step(s) {bad} that are not earlier steps; "
            f"a step may read only earlier steps: {allowed}"
        )
    return sorted(set(acc))


def parse_plan(
    text: str,
    agent_ids: Sequence[str] | None = None,
    *,
    max_steps: int = DEFAULT_MAX_STEPS,
    allow_empty: bool = False,
) -> Plan:
    """Parse and validate a conductor completion in either form.

    `agent_ids` lists the agents the plan may use, in the order the conductor saw them (an
    integer agent is a position in that list; None skips the check). `allow_empty` admits an
    empty plan (a refinement round that keeps the answer).
    """
    cleaned = _clean(text)
    lists = _parse_list_form(cleaned) or _parse_json_form(cleaned)
    if lists is None:
        raise PlanError(
            "no plan found: end the reply with the three lists model_id = [...], "
            "subtasks = [...], access_list = [...] (or a JSON list of step objects)"
        )
    return _validate(lists, agent_ids, max_steps, allow_empty)


def plan_json_schema(
    agent_ids: Collection[str],
    max_steps: int = DEFAULT_MAX_STEPS,
    *,
    allow_empty: bool = False,
    subtask_max_chars: int | None = None,
) -> dict[str, Any]:
    """JSON schema of the JSON form, for backends that constrain decoding to a schema.

    Steps are listed position by position (`prefixItems`) so that step i's access list can
    only name steps 0..i-1: under constrained decoding every plan is then valid by
    construction, not only well-formed.
    """
    subtask: dict[str, Any] = {"type": "string", "minLength": 8}  # a real instruction
    if subtask_max_chars:
        subtask["maxLength"] = subtask_max_chars

    def step(i: int) -> dict[str, Any]:
        earlier: dict[str, Any] = {"type": "array", "maxItems": 0}
        if i:
            earlier = {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": i - 1},
                "maxItems": i,
                "uniqueItems": True,
            }
        return {
            "type": "object",
            "properties": {
                "agent": {"type": "string", "enum": sorted(agent_ids)},
                "subtask": subtask,
                "access": {"anyOf": [{"type": "string", "enum": ["all"]}, earlier]},
            },
            "required": ["agent", "subtask", "access"],
            "additionalProperties": False,
        }

    return {
        "type": "object",
        "properties": {
            "steps": {
                "type": "array",
                "minItems": 0 if allow_empty else 1,
                "maxItems": max_steps,
                "prefixItems": [step(i) for i in range(max_steps)],
                "items": False,
            }
        },
        "required": ["steps"],
        "additionalProperties": False,
    }
