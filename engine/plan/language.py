"""The plan language: what the conductor writes, how it is parsed, and what makes it valid.

Two forms are accepted. The paper's form is free reasoning followed by three Python lists:

    model_id = ["gpt-5", "claude-sonnet-4"]
    subtasks = ["Solve the problem.", "Check the solution and give the final answer."]
    access_list = [[], "all"]

The labels may be spaced or cased as people write them (`model ids =`, `Access_List =`,
`sub tasks =`). The JSON form (what constrained decoding produces) is `{"reasoning": "...",
"steps": [{"agent", "subtask", "access"}, ...]}` (the reasoning first, as the paper's conductor
thinks before it plans; the parser ignores it), `{"steps": [...]}` (the bare form) or just the
list of step objects. When a reply holds both forms, the plan is the form it ends with (a JSON
plan that ends after the last list assignment starts wins), so lists quoted inside a JSON
reasoning string, or drafts before the final lists, never override it.

An agent is named by its id or by its number in the pool as the conductor was shown it (an
integer or a string of digits, counted from 0 like the steps). Access entries are `"all"`,
`["all"]` or any list containing "all" (every earlier step: the paper's Figure 2 writes
`[[], ["all"]]`), `[]` (none) or a list of 0-based indices of earlier steps.

Every failure raises PlanError with a message that says exactly what is wrong: that text is
recorded in the run, shown to the conductor on its next attempt, and scores 0 as a reward.
A reply that is one JSON plan as a whole (what constrained decoding writes) is read as written;
any other is cleaned first (think blocks and fences dropped, curly quotes made straight).
Parsing reads at most the reply's last MAX_REPLY_CHARS characters and searches the last
MAX_PLAN_CHARS of them once cleaned, in linear passes, whatever the reply holds (see "bounds"
below): a megabyte of garbage is an invalid plan in milliseconds, never a slow event loop, a
RecursionError, a MemoryError or any exception but PlanError.
"""

from __future__ import annotations

import ast
import json
import re
import reprlib
from collections import deque
from collections.abc import Collection, Iterator, Sequence
from typing import Any

from conductor_engine.engine.contracts.plans import DEFAULT_MAX_STEPS, Access, Plan, Step

REASONING_KEY = "reasoning"


class PlanError(ValueError):
    """The conductor's text is not a usable plan; str(error) says why."""


# --- bounds ----------------------------------------------------------------------------------
#
# The parser reads text a sampling model wrote, so it must stay fast and small on any input: a
# conductor at temperature 1.0 can emit a megabyte of brackets, and a parser that is slow,
# recursive or memory-hungry on it blocks the worker's event loop, crashes the attempt and makes
# Temporal pay for another completion. Every stage is one linear pass with no recursion that the
# input controls: clean-up reads at most MAX_REPLY_CHARS, the stages after it MAX_PLAN_CHARS.

MAX_PLAN_CHARS = 100_000
"""How much of the end of a reply is searched for the plan, once think blocks and fences are
removed. The conductor reasons first and writes the plan last; a plan of 20 steps of
4,000-character subtasks fits."""

MAX_REPLY_CHARS = 4 * MAX_PLAN_CHARS
"""How much of the end of a reply is read at all (what clean-up gets): the work per reply is
bounded, whatever its length. Only a think block of over 300,000 characters written after the
plan could push the plan out of the searched window."""

MAX_LIST_DEPTH = 8
"""Deepest bracket nesting a list literal may have (an access list needs 2)."""

MAX_JSON_CANDIDATES = 64
"""How many JSON values (the last ones that look like an object or a list of objects) are
tried. A 20-step plan holds about 22 such starts; each try reads at most MAX_PLAN_CHARS."""

# --- text clean-up -------------------------------------------------------------------------

_SMART = str.maketrans({"\u201c": '"', "\u201d": '"', "\u201e": '"', "\u2018": "'", "\u2019": "'"})
_THINK_TAG = re.compile(r"<(/?)think>", re.IGNORECASE)
# a fence line: [ \t] never crosses a line, so each line is looked at once
_FENCE = re.compile(r"^[ \t]*```[A-Za-z0-9_-]*[ \t]*$", re.MULTILINE)
_LIST_NAMES = ("model_id", "subtasks", "access_list")
# The three labels however people space or case them (`model ids`, `Access_List`, `sub tasks`):
# each optional part is one character or one letter, so a failed match costs a few steps.
_ASSIGN = re.compile(
    r"\b(model[ \t_-]?ids?|sub[ \t_-]?tasks?|access[ \t_-]?lists?)\s*[:=]\s*(?=\[)",
    re.IGNORECASE,
)
_LABEL_NAMES = {"mod": "model_id", "sub": "subtasks", "acc": "access_list"}
_JSON_START = re.compile(r"\{[ \t\r\n]*\"|\[[ \t\r\n]*\{")


def _without_thinking(text: str) -> str:
    """The text without `<think>...</think>` blocks; after a `</think>` with no opening tag (the
    chat template consumed it) only what follows the last such tag. One pass over the tags."""
    kept: list[str] = []
    pos, opened = 0, -1
    for m in _THINK_TAG.finditer(text):
        if not m.group(1):  # <think>
            if opened < 0:
                opened = m.start()
        elif opened >= 0:  # </think> closing a block: drop the block
            kept.append(text[pos:opened])
            pos, opened = m.end(), -1
        else:  # a stray </think>: everything before it was thinking
            kept, pos = [], m.end()
    kept.append(text[pos:])
    return "".join(kept)


def _clean(text: str) -> tuple[str, bool]:
    """The reply as the parser reads it: its last MAX_REPLY_CHARS cleaned, then their last
    MAX_PLAN_CHARS; and whether anything was cut. A block of thinking the first cut opens in
    the middle of reads as one whose opening tag the chat template ate: dropped all the same."""
    cut = len(text) > MAX_REPLY_CHARS
    text = _FENCE.sub("", _without_thinking(text[-MAX_REPLY_CHARS:].translate(_SMART)))
    if len(text) > MAX_PLAN_CHARS:
        return text[-MAX_PLAN_CHARS:], True
    return text, cut


def _show(value: Any) -> str:
    """A value quoted in an error message, never longer than a line."""
    return _REPR.repr(value)


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlist = 8
_REPR.maxlevel = 3

# --- list literals ---------------------------------------------------------------------------

_WORDS = frozenset({"all", "True", "False", "None"})
_STRING_PREFIXES = frozenset({"r", "u", "R", "U"})
_OPENERS, _CLOSERS = "[({", "])}"
_VALUE_ENDS = frozenset("])}\"'") | frozenset("0123456789")


def _scan_literal(text: str, start: int) -> tuple[int | None, str | None]:
    """Scan the bracketed literal that starts at `text[start] == "["`: the index just past its
    closing bracket (None if it is never closed) and the first reason it cannot be a plain list
    literal (None if it can).

    ast.literal_eval recurses on the syntax tree, so deep nesting, chains of unary signs or
    operators, and names such as `not` raise RecursionError or MemoryError inside it; this pass
    admits only strings, numbers, brackets, commas, colons, single signs and the names in
    _WORDS, at most MAX_LIST_DEPTH deep, before literal_eval ever sees the text. One pass,
    no recursion.
    """
    n, i, depth = len(text), start, 0
    problem: str | None = None
    prev = ""  # the last significant character outside strings
    while i < n:
        ch = text[i]
        if ch in "\"'":
            quote = ch * 3 if text.startswith(ch * 3, i) else ch
            i += len(quote)
            while i < n and not text.startswith(quote, i):
                i += 2 if text[i] == "\\" else 1
            if i >= n:
                return None, problem
            i += len(quote)
            prev = ch
            continue
        if ch in _OPENERS:
            depth += 1
            if depth > MAX_LIST_DEPTH and problem is None:
                problem = f"it nests brackets more than {MAX_LIST_DEPTH} deep"
        elif ch in _CLOSERS:
            depth -= 1
            if depth == 0:
                return i + 1, problem
        elif ch == "#":  # a comment, to the end of its line
            newline = text.find("\n", i)
            i = n if newline < 0 else newline
            continue
        elif ch.isalnum() or ch == "_" or (ch == "." and i + 1 < n and text[i + 1].isdigit()):
            j = i + 1
            while j < n and (text[j].isalnum() or text[j] in "_."
                             or (text[j] in "+-" and text[j - 1] in "eE" and ch.isdigit())):
                j += 1
            word = text[i:j]
            if problem is None and not (ch.isdigit() or ch == "." or word in _WORDS
                                        or (word in _STRING_PREFIXES and j < n
                                            and text[j] in "\"'")):
                problem = f"{_show(word)} is not a value (quote text as a string)"
            prev, i = word[-1], j
            if word in _STRING_PREFIXES:
                prev = ""  # the string that follows is the value
            continue
        elif ch in "+-":
            if problem is None and (prev in _VALUE_ENDS or prev in "+-" or prev.isalnum()):
                problem = f"it uses the operator {ch!r}; write plain values"
        elif ch not in ",: \t\r\n" and problem is None:
            problem = f"unexpected {ch!r}"
        if not ch.isspace():
            prev = ch
        i += 1
    return None, problem


def _literal(name: str, source: str, problem: str | None) -> list[Any]:
    if problem is None:
        if name == "access_list":  # tolerate a bare `all`
            source = re.sub(r"(?<![\"'\w])all(?![\"'\w])", '"all"', source)
        try:
            value = ast.literal_eval(source)
        # literal_eval's own failures; with the scan above RecursionError and MemoryError
        # should not happen, and if they do the reply is still just an invalid plan
        except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError) as e:
            problem = str(e) or type(e).__name__
        else:
            if not isinstance(value, list):
                raise PlanError(f"{name} must be a list")
            return value
    raise PlanError(f"{name} is not a valid Python list literal: {problem}")


# --- the two forms ---------------------------------------------------------------------------


Lists = dict[str, list[Any]]


def _parse_list_form(text: str) -> tuple[Lists | PlanError, int] | None:
    """The three lists, or the error that says why they are not a plan, with where the last
    assignment read starts (to tell which form the reply ends with); None when there is no
    assignment. Later assignments win, since reasoning may show drafts. Each literal is scanned
    once: an assignment inside an earlier literal is part of it, not a new one."""
    found: dict[str, list[Any] | PlanError] = {}
    pos = last = 0
    while (m := _ASSIGN.search(text, pos)) is not None:
        name = _LABEL_NAMES[m.group(1)[:3].lower()]
        last = m.start()
        end, problem = _scan_literal(text, m.end())
        if end is None:  # it swallowed the rest of the reply
            return PlanError(f"{name} opens a list that is never closed"), last
        try:
            found[name] = _literal(name, text[m.end():end], problem)
        except PlanError as e:
            found[name] = e
        pos = end
    if not found:
        return None
    missing = [n for n in _LIST_NAMES if n not in found]
    if missing:
        return PlanError(
            f"missing {', '.join(missing)}; write all three lists: model_id = [...], "
            f"subtasks = [...], access_list = [...]"
        ), last
    lists: Lists = {}
    for name in _LIST_NAMES:
        value = found[name]
        if isinstance(value, PlanError):
            return value, last
        lists[name] = value
    return lists, last


def _json_candidates(text: str) -> Iterator[tuple[Any, int]]:
    """The values (with where each ends) of the last MAX_JSON_CANDIDATES places where an
    object (`{"`) or a list of objects (`[{`) starts and decodes, last first, decoded one at a
    time as they are asked for.
    Trying every `[` and `{` (as this once did) read the rest of the text from each: quadratic
    on a run of brackets."""
    starts: deque[int] = deque(maxlen=MAX_JSON_CANDIDATES)
    starts.extend(m.start() for m in _JSON_START.finditer(text))
    # strict=False: raw control characters inside strings, which JSON forbids but grammar-
    # constrained decoders (xgrammar) let a model write, do not cost a whole plan
    decoder = json.JSONDecoder(strict=False)
    for i in reversed(starts):
        try:
            value, end = decoder.raw_decode(text, i)
        except (ValueError, RecursionError):  # JSONDecodeError; nesting past the C stack guard
            continue
        yield value, end


def _json_plan(value: Any) -> Lists | None:
    """The lists of a decoded JSON plan (`{"steps": [...]}`, with or without other keys such
    as the "reasoning" the conductor writes first, or the bare list of step objects); None when
    the value is not one."""
    steps = value.get("steps") if isinstance(value, dict) else value
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        return None
    if isinstance(value, list) and not steps:
        return None  # a bare [] is more likely an access list than a plan
    return {
        "model_id": [s.get("agent", s.get("model_id", s.get("model"))) for s in steps],
        "subtasks": [s.get("subtask", s.get("task")) for s in steps],
        "access_list": [s.get("access", s.get("access_list", "all")) for s in steps],
    }


def _parse_json_form(text: str) -> tuple[Lists, int] | None:
    """The last JSON plan in the text, and where it ends."""
    for value, end in _json_candidates(text):
        if (lists := _json_plan(value)) is not None:
            return lists, end
    return None


def _whole_reply_plan(text: str) -> Lists | None:
    """The plan when the whole reply is one JSON plan, read as written; else None.

    That is what a grammar-constrained decoder (or a provider's structured output) returns, and
    the plan is then valid as written: clean-up is for free text and is lossy inside a JSON
    string. It made a subtask's curly quote (“, which the grammar lets a model write) a
    straight one that ended the string early, and a valid plan an invalid one (reward 0)."""
    body = text.strip()
    if len(body) > MAX_PLAN_CHARS or not body.startswith(("{", "[")):
        return None
    try:  # strict=False: raw control characters in strings, as _json_candidates allows
        value = json.JSONDecoder(strict=False).decode(body)
    except (ValueError, RecursionError):  # JSONDecodeError; nesting past the C stack guard
        return None
    return _json_plan(value)


def _plan_lists(text: str) -> Lists | None:
    """The plan the reply ends with, in either form; None when it holds neither.

    A JSON plan that ends after the last list assignment starts wins: lists the conductor
    quoted inside its JSON "reasoning" string (the reasoning-first form) are thoughts, not the
    plan, even when they are broken. Otherwise the list form decides, its error included: a
    JSON draft in the reasoning never stands in for broken final lists."""
    listed, in_json = _parse_list_form(text), _parse_json_form(text)
    if in_json is not None and (listed is None or in_json[1] > listed[1]):
        return in_json[0]
    if listed is None:
        return None
    if isinstance(listed[0], PlanError):
        raise listed[0]
    return listed[0]


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
                f"{where}: unknown agent {_show(agent)}; choose one of (by id or number): "
                f"{', '.join(f'{n} {a}' for n, a in enumerate(agent_ids))}"
            )
        if not isinstance(subtask, str) or not subtask.strip():
            raise PlanError(
                f"{where}: the subtask must be a non-empty string, got {_show(subtask)}"
            )
        steps.append(Step(agent=agent, subtask=subtask.strip(), access=_access(acc, i, where)))
    return Plan(steps=steps)


def _agent_id(agent: Any, agent_ids: Sequence[str] | None, where: str) -> str:
    """An agent named by id, or by its number in the pool listing (the paper's integers; the
    listing numbers from 0, like the steps), written as an integer or a string of digits. An
    id made of digits is that agent, never a number: an id always means what it says."""
    if isinstance(agent, str) and agent_ids is not None:
        name = agent.strip()
        if name not in agent_ids and name.isascii() and name.isdigit() and len(name) < 10:
            agent = int(name)
    if type(agent) is int and agent_ids is not None:
        if not 0 <= agent < len(agent_ids):
            raise PlanError(
                f"{where}: agent number {agent} is out of range; the pool has "
                f"{len(agent_ids)} agents, numbered 0..{len(agent_ids) - 1}"
            )
        return agent_ids[agent]
    if not isinstance(agent, str) or not agent.strip():
        raise PlanError(f"{where}: the agent must be a non-empty string, got {_show(agent)}")
    return agent.strip()


def _is_all(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == "all"


def _access(acc: Any, index: int, where: str) -> Access:
    """One step's access entry. "all", ["all"] and any list that contains "all" are every
    earlier step: the paper's Figure 2 writes `["all"]`, and a list that grants everything
    and some steps besides still grants everything."""
    if _is_all(acc) or (isinstance(acc, list) and any(_is_all(j) for j in acc)):
        return "all"
    if not isinstance(acc, list) or not all(type(j) is int for j in acc):
        raise PlanError(
            f'{where}: access must be "all", [] or a list of earlier step indices, got {_show(acc)}'
        )
    bad = [j for j in acc if not 0 <= j < index]
    if bad:
        allowed = f"0..{index - 1}" if index else "none (it is the first step; use [])"
        raise PlanError(
            f"{where}: access {_show(acc)} names step(s) {_show(bad)} that are not earlier steps; "
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
    cleaned, cut = _clean(text)
    try:
        lists = _whole_reply_plan(text)
        if lists is None:
            lists = _plan_lists(cleaned)
        if lists is None:
            where = f" within its last {MAX_PLAN_CHARS:,} characters" if cut else ""
            raise PlanError(
                f"no plan found{where}: end the reply with the three lists model_id = [...], "
                "subtasks = [...], access_list = [...] (or a JSON list of step objects)"
            )
        return _validate(lists, agent_ids, max_steps, allow_empty)
    except PlanError:
        raise
    except Exception as e:  # a safety net: no stage should raise anything else
        # Whatever a reply makes the parser raise, it is one invalid plan (recorded, reward 0):
        # never a failed activity that Temporal retries, paying for a new completion each time.
        raise PlanError(f"the plan could not be parsed ({type(e).__name__}); write it plainly, "
                        "at the end of the reply") from e


def plan_json_schema(
    agent_ids: Collection[str],
    max_steps: int = DEFAULT_MAX_STEPS,
    *,
    allow_empty: bool = False,
    subtask_max_chars: int | None = None,
    reasoning_max_chars: int | None = None,
) -> dict[str, Any]:
    """JSON schema of the JSON form, for backends that constrain decoding to a schema.

    Steps are listed position by position (`prefixItems`) so that step i's access list can
    only name steps 0..i-1: under constrained decoding every plan is then valid by
    construction, not only well-formed.

    With `reasoning_max_chars` the object's first property is a free-text "reasoning" string of
    at most that many characters, then "steps": decoders write properties in schema order, so
    the conductor thinks before it plans, as in the paper, and the bound keeps the thinking
    from eating the token budget the plan needs. None gives the bare form ({"steps": [...]}),
    the fewest tokens, for conductors too small to gain from reasoning.
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

    properties: dict[str, Any] = {}
    if reasoning_max_chars is not None:
        properties[REASONING_KEY] = {"type": "string", "maxLength": reasoning_max_chars}
    properties["steps"] = {
        "type": "array",
        "minItems": 0 if allow_empty else 1,
        "maxItems": max_steps,
        "prefixItems": [step(i) for i in range(max_steps)],
        "items": False,
    }
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }
