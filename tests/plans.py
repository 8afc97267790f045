"""Plans as a scripted conductor writes them: `plan_json` for one plan, and
`self_calling_conductor`, a conductor whose plan hands a step to the conductor itself."""

from __future__ import annotations

import json


def plan_json(*steps: tuple[str, str, object]) -> str:
    """A plan of (agent, subtask, access) steps, as the conductor's JSON reply."""
    return json.dumps({"steps": [{"agent": a, "subtask": s, "access": acc} for a, s, acc in steps]})


def self_calling_conductor(prompt: str) -> str:
    """Plans for the parent (a self-call then a summary) and for the child (one gpt step)."""
    if "Task:\nFind the two numbers." in prompt:
        return plan_json(("gpt", "Compute 2^10 and 10^3.", []))
    return plan_json(("conductor", "Find the two numbers.", []), ("claude", "Compare.", "all"))
