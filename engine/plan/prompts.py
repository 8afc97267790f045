"""Every prompt the engine sends, in one place: the conductor's and the agents'.

Kept together so that a change of wording is one diff, and so the trainer sees exactly the
prompt the conductor was sampled with.
"""

from __future__ import annotations

from collections.abc import Sequence

from conductor_engine.engine.plan.language import Plan
from conductor_engine.engine.providers.base import Message
from conductor_engine.engine.providers.pool import AgentSpec
from conductor_engine.engine.tasks.model import VisibleStep

CONDUCTOR_ROLE = """\
You are the conductor of a team of language models. You do not answer the question yourself:
you write a short plan that gives subtasks to the models in the pool, and the output of the
plan's last step is the final answer. Choose each model for what it is good at, split the work
only when that helps, and give the last step the job of stating the final answer clearly."""

LIST_FORMAT = """\
Think briefly about the task, then end your reply with exactly three Python lists of equal
length, one entry per step, steps numbered from 0:

model_id = [...]     # which model does each step (ids from the pool)
subtasks = [...]     # the instruction for each step, in plain language
access_list = [...]  # which earlier steps each step may read: "all", [] for none,
                     # or a list of earlier step numbers such as [0, 2]

Use at most {max_steps} steps. A step may read only earlier steps."""

JSON_FORMAT = """\
Reply with a JSON object {{"steps": [...]}}: at most {max_steps} step objects, each with
"agent" (a model id from the pool), "subtask" (the instruction) and "access" ("all", [] for
none, or a list of earlier step numbers counted from 0). A step may read only earlier steps."""

EXAMPLES = """\
Example 1. Task: "What is 17 * 24?"
model_id = ["{a}"]
subtasks = ["Compute 17 * 24 and give the final number."]
access_list = [[]]

Example 2. Task: "Write a Python function that checks whether a string is a palindrome."
The work splits into writing the code and reviewing it.
model_id = ["{a}", "{b}", "{a}"]
subtasks = ["Write the function with a docstring.", "Review the function for bugs and edge cases.", "Give the final corrected function."]
access_list = [[], [0], "all"]

Example 3. Task: "Compare the causes of the two world wars in three sentences."
Two independent drafts, then one step that merges them.
model_id = ["{a}", "{b}", "{b}"]
subtasks = ["List the main causes of World War I.", "List the main causes of World War II.", "Write the three-sentence comparison from both lists."]
access_list = [[], [], [0, 1]]"""


def pool_listing(agents: Sequence[AgentSpec]) -> str:
    return "\n".join(f"- {a.id}: {a.description or a.model}" for a in agents)


def conductor_messages(
    question: str,
    agents: Sequence[AgentSpec],
    *,
    max_steps: int,
    json_mode: bool,
    context: Sequence[VisibleStep] = (),
    previous: Sequence[tuple[Plan, str]] = (),
    last_error: str | None = None,
) -> list[Message]:
    """The conductor's prompt for one plan attempt.

    `previous` holds (plan, final answer) of earlier rounds, for a refinement round; an empty
    plan then keeps the last answer. `last_error` is why the previous attempt did not parse.
    """
    ids = [a.id for a in agents]
    a, b = ids[0], ids[1] if len(ids) > 1 else ids[0]
    fmt = (JSON_FORMAT if json_mode else LIST_FORMAT).format(max_steps=max_steps)
    system = "\n\n".join(
        [
            CONDUCTOR_ROLE,
            "The pool:\n" + pool_listing(agents),
            fmt,
            EXAMPLES.format(a=a, b=b) if not json_mode else "",
        ]
    ).strip()
    parts = []
    if context:
        parts.append("Background from the larger job this task belongs to:\n" + _steps(context))
    parts.append(f"Task:\n{question}")
    for r, (plan, answer) in enumerate(previous, start=1):
        parts.append(
            f"Your plan in round {r}:\n{plan.to_paper_form()}\n\nIts final answer:\n{answer}"
        )
    if previous:
        parts.append(
            "Write a new plan that improves on that answer, or an empty plan (empty lists) "
            "if the answer is already right."
        )
    if last_error:
        parts.append(f"Your previous reply was not a valid plan: {last_error}. Try again.")
    return [Message(role="system", content=system), Message(role="user", content="\n\n".join(parts))]


def _steps(steps: Sequence[VisibleStep]) -> str:
    return "\n\n".join(
        f"[step {s.index}, {s.agent}] Subtask: {s.subtask}\nResponse: {s.output}" for s in steps
    )


def agent_messages(
    question: str, subtask: str, visible: Sequence[VisibleStep]
) -> list[Message]:
    """An agent's prompt: the overall task, what it may see of earlier steps, its subtask."""
    parts = [f"You are one member of a team working on this task:\n{question}"]
    if visible:
        parts.append("Work done so far by other members that you may use:\n" + _steps(visible))
    parts.append(f"Your subtask:\n{subtask}")
    parts.append("Answer the subtask directly and completely.")
    return [Message(role="user", content="\n\n".join(parts))]
