"""Simulated agents for rehearsals (provider "sim"): no model, no key, no cost beyond the prices
the pool file gives them.

A sim agent answers a task right with the probability its skill matrix sets for the task's tags
(the best of them; `default_skill` when none is listed) and wrong otherwise. The draw comes from
SHA-256 of (task id, agent id, sample, attempt), so the same rollout gets the same answer on
every run and every machine, while the rollouts of a group draw independently, and so do a
task's rollouts of different iterations (a training run numbers them up across iterations:
workflows/train.py `rollout_draw`).

- right: the task's reference as written (in `\\boxed{}` for a math expression that is not a
  plain number, which math-verify reads only inside delimiters), which every verifier but
  `code` accepts (a sim agent writes no programs, so a `code` task's "right" answer, its own
  tests, still fails);
- wrong: an answer the task's verifier rejects: another letter for `choice`, the reference plus
  one for a numeric reference, "I am not sure." otherwise;
- which verifier judges the reference (and a choice's letter) is the agent activity's to say,
  from the verifiers themselves (TaskInfo.key: engine/rewards `answer_key`), so this module
  needs no verifier of its own;
- no task or no reference (a self-call's subtask, a call made by hand): a neutral answer.

Context matters (docs/how-to/rehearse-plans.md):

- review: a step that sees an earlier right answer (TaskInfo.seen, the outputs of the steps it
  may read) keeps it with the agent's `review` rate for the task's tags, drawn like the answer;
  otherwise it answers as usual. An earlier answer counts as right when it is the right answer
  as a sim agent writes it (or the reference, up to case and punctuation);
- composite tasks (TaskInfo.parts): each part is answered apart, with the agent's skill and
  review rate for that part's tag, and the answer lists the parts' answers in order, separated
  by "; ". It is right only when every part is: a plan must reach, within what its final step
  sees, an agent that got each part right, and every step on the way must keep it.

Latency (`latency_s` plus a repeatable draw of up to `latency_jitter_s`) is an asyncio sleep, so
a cancelled run stops waiting at once. Usage is reported as prompt characters times
`input_tokens_per_char` in, `output_tokens` out (capped by the call's max_tokens); the
dispatcher prices it with the pool's prices like any other agent's.
"""

from __future__ import annotations

import asyncio
import hashlib
import re

from conductor_engine.engine.contracts.agent_calls import AnswerKey, TaskInfo, Usage
from conductor_engine.engine.contracts.agents import AgentSpec, SimSettings
from conductor_engine.engine.providers.base import Completion, CompletionRequest
from conductor_engine.engine.providers.registry import Capabilities
from conductor_engine.engine.text import normalize_text

# A sim agent only answers: no JSON mode, no search, and never a conductor to train.
CAPABILITIES = {"sim": Capabilities()}

UNSURE = "I am not sure."


def preload() -> None:
    """Nothing to import: a sim agent calls no SDK (the `Provider` protocol asks every module)."""
_NUMBER = re.compile(r"^\s*([-+]?)(\d[\d,]*)(?:\.(\d+))?\s*(%?)\s*$")


def draw(*parts: object) -> float:
    """A number in [0, 1) fixed by `parts`: the same on every run, process and machine (a
    stable hash, unlike Python's `hash`, which is salted per process)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


SEPARATOR = "; "
"""Between the parts' answers of a composite task, in its reference and in a sim's answer."""


def part_references(task: TaskInfo) -> list[tuple[list[str], str]]:
    """(tags, reference) of each part: a composite task's parts, else the task as one part."""
    reference = task.reference or ""
    if not task.parts:
        return [(task.tags, reference)]
    answers = reference.split(SEPARATOR)
    if len(answers) != len(task.parts):  # Task refuses this; a hand-made TaskInfo may not
        return [(task.tags or task.parts, reference)]
    return [([tag], answer) for tag, answer in zip(task.parts, answers, strict=True)]


def key_of(task: TaskInfo) -> AnswerKey:
    """How the task's verifier reads its reference: as the agent activity read it with the
    verifiers (TaskInfo.key), else the task's verifier as given, `exact` when unset or auto (a
    hand-made TaskInfo; the sim reads no reference itself)."""
    if task.key is not None:
        return task.key
    name = (task.verifier or "exact").strip().lower()
    return AnswerKey(verifier="exact" if name == "auto" else name)


def _seen_right(seen: list[str], k: int, parts: list[tuple[list[str], str]],
                key: AnswerKey) -> bool:
    """Whether an earlier answer got part k right (the whole task when it has one part)."""
    reference = parts[k][1]
    if len(parts) == 1:
        good = {right_answer(reference, key).strip(), reference.strip()}
        return any(a.strip() in good or normalize_text(a) == normalize_text(reference)
                   for a in seen)
    for a in seen:
        pieces = a.split(SEPARATOR)
        if len(pieces) == len(parts) and normalize_text(pieces[k]) == normalize_text(reference):
            return True
    return False


def outcome(spec: AgentSpec, settings: SimSettings, task: TaskInfo) -> list[bool]:
    """Whether this agent gets each part of this rollout of this task right, given the earlier
    answers its step sees. A one-part task draws its answer exactly as before review and parts
    existed, so old rehearsals repeat."""
    parts = part_references(task)
    key = (task.task_id, spec.id, task.sample, task.attempt)
    right = []
    for k, (tags, _) in enumerate(parts):
        extra = () if len(parts) == 1 else ("part", k)
        if (task.seen and _seen_right(task.seen, k, parts, key_of(task))
                and draw("review", *key, k) < settings.review_rate(tags)):
            right.append(True)
            continue
        right.append(draw("answer", *key, *extra) < settings.skill(tags))
    return right


def is_right(spec: AgentSpec, settings: SimSettings, task: TaskInfo) -> bool:
    """Whether this agent answers this rollout of this task right (every part of it)."""
    return all(outcome(spec, settings, task))


def _plus_one(reference: str) -> str | None:
    """A numeric reference plus one, written the same way ("1,000" → "1001", "2.5" → "3.5",
    "50%" → "51%"); None when the reference is not a plain number."""
    m = _NUMBER.match(reference)
    if not m:
        return None
    sign, whole, frac, percent = m.groups()
    value = int(whole.replace(",", "")) * (-1 if sign == "-" else 1) + 1
    if frac is None:
        return f"{value}{percent}"
    # keep the decimals exactly: -2.5 + 1 = -1.5
    exact = float(f"{sign}{whole.replace(',', '')}.{frac}") + 1
    return f"{exact:.{len(frac)}f}{percent}"


def right_answer(reference: str, key: AnswerKey) -> str:
    """An answer to a task with this reference that its verifier accepts (but see `code`)."""
    if key.verifier != "math" or _NUMBER.match(reference):
        return reference
    if "$" in reference or "\\boxed" in reference or "\\(" in reference or "\\[" in reference:
        return reference
    return f"\\boxed{{{reference}}}"


def wrong_answer(reference: str, key: AnswerKey) -> str:
    """An answer to a task with this reference that its verifier does not accept (a choice
    reference whose letter the key does not give gets no letter at all)."""
    if key.verifier == "choice" and key.letter is not None:
        return "B" if key.letter == "A" else "A"
    number = _plus_one(reference)
    if number is not None:
        return number
    if normalize_text(reference) == normalize_text(UNSURE):
        return "I do not know."
    return UNSURE


def answer(spec: AgentSpec, settings: SimSettings, task: TaskInfo | None) -> str:
    if task is None or task.reference is None or not task.reference.strip():
        return f"({spec.id}, simulated: there is no reference answer to be right or wrong about.)"
    right = outcome(spec, settings, task)
    parts = part_references(task)
    if len(parts) == 1:
        key = key_of(task)
        return (right_answer if right[0] else wrong_answer)(task.reference, key)
    exact = AnswerKey(verifier="exact")
    return SEPARATOR.join(ref if ok else wrong_answer(ref, exact)
                          for (_, ref), ok in zip(parts, right, strict=True))


def latency(spec: AgentSpec, settings: SimSettings, task: TaskInfo | None) -> float:
    if not settings.latency_jitter_s:
        return settings.latency_s
    key = (task.task_id, task.sample, task.attempt) if task else ("", 0, 1)
    return settings.latency_s + settings.latency_jitter_s * draw("latency", spec.id, *key)


async def complete(spec: AgentSpec, request: CompletionRequest) -> Completion:
    settings = spec.sim or SimSettings()
    seconds = latency(spec, settings, request.task)
    if seconds > 0:
        await asyncio.sleep(seconds)  # a cancellation lands here
    chars = sum(len(m.content) for m in request.messages)
    return Completion(
        text=answer(spec, settings, request.task),
        usage=Usage(
            input_tokens=round(chars * settings.input_tokens_per_char),
            output_tokens=min(settings.output_tokens, request.max_tokens),
        ),
        model=spec.model,
        finish_reason="stop",
    )
