"""A plan's shape, read off the JSON text as it is written: how many steps, and whether each
later step sees an earlier one.

A shape is the sequence of its *shape outcomes*, in the order the plan's text decides them:

    after step i's object closes      "more" (the `,` that adds a step) or "end" (the `]`)
    step i >= 1's access list         "sees" ("all" or a list of earlier steps) or "apart" ([])

so a one-step plan is ("end",), a draft and its reviewer ("more", "sees", "end"), two steps
apart ("more", "apart", "end"). What fills a shape (the agents, the subtasks, which earlier steps
a list names) is not part of it. The first step's access is not either: it can see nothing.

`decided` scans a compact plan text (the JSON form the local grammar writes, no free whitespace;
bare or with a leading "reasoning") in one pass and says where each outcome was decided: the
sampler uses it to force a shape (engine/providers/local/shaping.py), the trainer to credit one
(trainer/grpo/_shapes.py). Linear in the text; a text that is no plan decides nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Outcome = Literal["more", "end", "sees", "apart"]
Shape = tuple[Outcome, ...]


@dataclass(frozen=True)
class Decided:
    """One shape outcome and the characters that made it: `start` is where its value began
    (the access list's first character, or the `,`/`]` itself) and `at` the character that
    settled it (`[` alone settles nothing: the next `]` or digit does)."""

    outcome: Outcome
    start: int
    at: int


def shapes(max_steps: int) -> list[Shape]:
    """Every shape a plan of 1..max_steps steps can take, the shortest first."""
    out: list[Shape] = [("end",)]
    grown: list[Shape] = [()]
    for _ in range(1, max_steps):
        grown = [(*g, "more", s) for g in grown for s in ("sees", "apart")]
        out.extend((*g, "end") for g in grown)
    return out


def shape_label(shape: Shape) -> str:
    """A shape as people name it: "1 step", "2 steps (sees)", "3 steps (sees, apart)"."""
    looks = [o for o in shape if o in ("sees", "apart")]
    n = len(looks) + 1
    return "1 step" if n == 1 else f"{n} steps ({', '.join(looks)})"


def parse_shape(text: str) -> Shape:
    """The inverse of ",".join(shape): "more,sees,end" -> ("more", "sees", "end")."""
    out = tuple(text.split(","))
    for o in out:
        if o not in ("more", "end", "sees", "apart"):
            raise ValueError(f"{o!r} is no shape outcome (more, end, sees, apart): {text!r}")
    return out  # type: ignore[return-value]


def decided(text: str) -> list[Decided]:
    """The shape outcomes `text` (a plan's JSON, possibly unfinished) has decided, in order."""
    out: list[Decided] = []
    stack: list[str] = []  # "{" and "[" of the containers open
    in_string = escape = False
    key: str | None = None  # the last key read at the current object level
    string_start = 0
    keys: list[str | None] = []  # per open container: the key it is the value of
    steps = 0  # step objects opened in the steps array
    pending_access: int | None = None  # a step >= 1's access list opened with `[` at this index
    after_step = False  # a step object has just closed: the next `,` or `]` decides
    expect_access = False  # the next value is a step >= 1's access
    for i, c in enumerate(text):
        if in_string:
            if escape:
                escape = False
            elif c == "\\":
                escape = True
            elif c == '"':
                in_string = False
                if expect_value_key(stack, text, i):
                    key = text[string_start + 1 : i]
            continue
        in_steps = len(stack) >= 2 and stack[:2] == ["{", "["] and keys[1] == "steps"
        if after_step:
            after_step = False
            if c in ",]":
                out.append(Decided("more" if c == "," else "end", i, i))
        if pending_access is not None:
            if c == "]":
                out.append(Decided("apart", pending_access, i))
            elif c.isdigit():
                out.append(Decided("sees", pending_access, i))
            pending_access = None
        if expect_access and c not in ":":
            expect_access = False
            if c == '"':
                out.append(Decided("sees", i, i))
            elif c == "[":
                pending_access = i
        if c == '"':
            in_string, string_start = True, i
        elif c in "{[":
            keys.append(key if stack else None)
            stack.append(c)
            key = None
            if c == "{" and in_steps and len(stack) == 3:
                steps += 1
        elif c in "}]":
            if not stack:
                break
            stack.pop()
            keys.pop()
            key = None
            if c == "}" and in_steps and len(stack) == 2:
                after_step = True
        elif c == ":" and key == "access" and in_steps and len(stack) == 3 and steps >= 2:
            expect_access = True
        elif c == ",":
            key = None
    return out


def expect_value_key(stack: list[str], text: str, end: int) -> bool:
    """Whether the string that closed at `end` is an object's key (a `:` follows it)."""
    return bool(stack) and stack[-1] == "{" and text[end + 1 : end + 2] == ":"


def shape_of(text: str) -> Shape:
    """The outcomes `text` decided, as a shape (complete only for a complete plan)."""
    return tuple(d.outcome for d in decided(text))


def consistent(shape: Shape, target: Shape) -> bool:
    """Whether a plan that has decided `shape` so far can still end as `target`."""
    return len(shape) <= len(target) and target[: len(shape)] == shape
