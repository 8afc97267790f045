"""Simulated agents for rehearsals (provider "sim"): no model, no key, no cost beyond the prices
the pool file gives them.

A sim agent answers a task right with the probability its skill matrix sets for the task's tags
(the best of them; `default_skill` when none is listed) and wrong otherwise. The draw comes from
SHA-256 of (task id, agent id, sample, attempt), so the same rollout gets the same answer on
every run and every machine, while the rollouts of a group (samples 0..G-1) draw independently.

- right: the task's reference as written (in `\\boxed{}` for a math expression that is not a
  plain number, which math-verify reads only inside delimiters), which every verifier but
  `code` accepts (a sim agent writes no programs, so a `code` task's "right" answer, its own
  tests, still fails);
- wrong: an answer the task's verifier rejects: another letter for `choice`, the reference plus
  one for a numeric reference, "I am not sure." otherwise;
- no task or no reference (a self-call's subtask, a call made by hand): a neutral answer.

Latency (`latency_s` plus a repeatable draw of up to `latency_jitter_s`) is an asyncio sleep, so
a cancelled run stops waiting at once. Usage is reported as prompt characters times
`input_tokens_per_char` in, `output_tokens` out (capped by the call's max_tokens); the
dispatcher prices it with the pool's prices like any other agent's.
"""

from __future__ import annotations

import asyncio
import hashlib
import re

from conductor_engine.engine.contracts.agent_calls import TaskInfo, Usage
from conductor_engine.engine.providers.base import Completion, CompletionRequest
from conductor_engine.engine.providers.pool import AgentSpec, SimSettings
from conductor_engine.engine.providers.registry import Capabilities
from conductor_engine.engine.rewards.extract import normalize_text
from conductor_engine.engine.rewards.verifiers import detect_verifier, reference_letter

# A sim agent only answers: no JSON mode, no search, and never a conductor to train.
CAPABILITIES = {"sim": Capabilities()}

UNSURE = "I am not sure."
_NUMBER = re.compile(r"^\s*([-+]?)(\d[\d,]*)(?:\.(\d+))?\s*(%?)\s*$")


def draw(*parts: object) -> float:
    """A number in [0, 1) fixed by `parts`: the same on every run, process and machine (a
    stable hash, unlike Python's `hash`, which is salted per process)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def is_right(spec: AgentSpec, settings: SimSettings, task: TaskInfo) -> bool:
    """Whether this agent answers this rollout of this task right."""
    u = draw("answer", task.task_id, spec.id, task.sample, task.attempt)
    return u < settings.skill(task.tags)


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


def _verifier(reference: str, verifier: str | None) -> str:
    name = (verifier or "auto").strip().lower()
    return detect_verifier(reference) if name == "auto" else name


def right_answer(reference: str, verifier: str | None) -> str:
    """An answer to a task with this reference that its verifier accepts (but see `code`)."""
    if _verifier(reference, verifier) != "math" or _NUMBER.match(reference):
        return reference
    if "$" in reference or "\\boxed" in reference or "\\(" in reference or "\\[" in reference:
        return reference
    return f"\\boxed{{{reference}}}"


def wrong_answer(reference: str, verifier: str | None) -> str:
    """An answer to a task with this reference that its verifier does not accept."""
    name = _verifier(reference, verifier)
    if name == "choice":
        letter = reference_letter(reference)
        return "B" if letter == "A" else "A"
    number = _plus_one(reference)
    if number is not None:
        return number
    if normalize_text(reference) == normalize_text(UNSURE):
        return "I do not know."
    return UNSURE


def answer(spec: AgentSpec, settings: SimSettings, task: TaskInfo | None) -> str:
    if task is None or task.reference is None or not task.reference.strip():
        return f"({spec.id}, simulated: there is no reference answer to be right or wrong about.)"
    if is_right(spec, settings, task):
        return right_answer(task.reference, task.verifier)
    return wrong_answer(task.reference, task.verifier)


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
