"""The batch every fault test runs: task i asks for i + 1; the conductor plans three steps whose
subtasks name the number (so each step's request is its own), and the last agent answers."""

from __future__ import annotations

import re

from conductor_engine.engine.contracts.tasks import RunOptions, Task
from tests.plans import plan_json

MODELS = {"conductor": "conductor", "gpt": "gpt", "claude": "claude", "gemini": "gemini"}
"""Agent id -> the model the agent server sees (make_pool's agents)."""


def number(prompt: str) -> int:
    found = re.findall(r"(?:Compute|Read|Add one to|State) (\d+)", prompt)
    assert found, prompt[:300]
    return int(found[-1])


def conductor(prompt: str) -> str:
    n = number(prompt)
    return plan_json(("gpt", f"Read {n}.", []), ("claude", f"Add one to {n}.", [0]),
                     ("gemini", f"State {n} + 1.", "all"))


def gpt(prompt: str) -> str:
    return f"the number {number(prompt)}"


def claude(prompt: str) -> str:
    return f"plus one is {number(prompt) + 1}"


def gemini(prompt: str) -> str:
    return f"The answer is {number(prompt) + 1}"


ANSWERS = {"conductor": conductor, "gpt": gpt, "claude": claude, "gemini": gemini}


def tasks(prefix: str, n: int, **options: object) -> list[Task]:
    return [Task(id=f"{prefix}-{i:03d}", question=f"Compute {i} + 1.", reference=str(i + 1),
                 verifier="math", dataset="arith",
                 options=RunOptions(max_plan_attempts=1, **options))  # type: ignore[arg-type]
            for i in range(n)]
