"""A plan's shape, read off the JSON text as it is written: how many steps, and whether each
later step sees an earlier one.

A shape is the sequence of its *shape outcomes*, in the order the plan's text decides them:

    after step i's object closes      "more" (the `,` that adds a step) or "end" (the `]`)
    step i >= 1's access list         "sees" ("all" or a list of earlier steps) or "apart" ([])

so a one-step plan is ("end",), a draft and its reviewer ("more", "sees", "end"), two steps
apart ("more", "apart", "end"). What fills a shape (the agents, the subtasks, which earlier steps
a list names) is not part of it. The first step's access is not either: it can see nothing.

`decided` scans a plan's JSON text (bare or with a leading "reasoning"; whitespace between
tokens is skipped) in one pass and says where each outcome was decided: the
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
    last_string = ""
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
                last_string = text[string_start + 1 : i]  # the key, if a `:` follows
            continue
        if c in " \t\r\n":  # JSON's whitespace between tokens decides nothing
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
        if expect_access:
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
        elif c == ":":
            key = last_string if stack and stack[-1] == "{" else None
            expect_access = key == "access" and in_steps and len(stack) == 3 and steps >= 2
        elif c == ",":
            key = None
    return out


def shape_of(text: str) -> Shape:
    """The outcomes `text` decided, as a shape (complete only for a complete plan)."""
    return tuple(d.outcome for d in decided(text))


def consistent(shape: Shape, target: Shape) -> bool:
    """Whether a plan that has decided `shape` so far can still end as `target`."""
    return len(shape) <= len(target) and target[: len(shape)] == shape


def forced_rollouts(share: float, iterations: int | None, iteration: int, group_size: int
                    ) -> tuple[int, bool]:
    """How many of a group's rollouts (its last ones) have their shape forced at `iteration`
    (the recipe's [rollouts] force_shapes and force_shapes_iterations), and whether only as a
    rescue: forced only when every one of the group's other rollouts failed.

    The share falls linearly from `share` to 0 over `iterations`; from then on, the group's
    unforced rollouts run first, and its last round(share * G) are forced only if none of them
    answered right (a shape nobody writes gets tried where nothing else pays)."""
    full = round(share * group_size)
    if iterations is None:
        return full, False
    if iteration < iterations:
        return round(share * (1 - iteration / iterations) * group_size), False
    return full, True


def forced_shape(max_steps: int, sample: int, group_size: int, forced: int) -> Shape | None:
    """The shape rollout `sample` of a group is forced to when its last `forced` are: every
    shape `max_steps` allows in turn (shapes(max_steps)), None for an unforced rollout."""
    first = group_size - forced
    if sample < first:
        return None
    every = shapes(max_steps)
    return every[(sample - first) % len(every)]


def warmup_forced_shape(max_steps: int, sample: int, samples: int, forced: int, *,
                        live_only: bool = False) -> Shape | None:
    """The shape a warm-up sample is forced to when a task's last `forced` of `samples` are:
    every multi-step shape `max_steps` allows in turn (a one-step plan the policy writes by
    itself), None for an unforced sample or where a plan has one step at most. With
    `live_only` ([warmup] dead_steps = "skip"), not a shape whose last step sees nothing: every
    earlier step of it is dead, and the warm-up would never learn it."""
    longer = [s for s in shapes(max_steps)[1:] if not (live_only and s[-2] == "apart")]
    first = samples - forced
    if sample < first or not longer:
        return None
    return longer[(sample - first) % len(longer)]
