"""Every prompt the engine sends, in one place: the conductor's and the agents'.

Kept together so that a change of wording is one diff, and so the trainer sees exactly the
prompt the conductor was sampled with.
"""

from __future__ import annotations

from collections.abc import Sequence

from conductor_engine.engine.contracts.agent_calls import Message
from conductor_engine.engine.contracts.plans import Plan
from conductor_engine.engine.contracts.tasks import SeenStep
from conductor_engine.engine.providers.pool import AgentSpec

CONDUCTOR_ROLE = """\
You are the conductor of a team of language models. You do not answer the question yourself:
you write a short plan that gives subtasks to the models in the pool, and the output of the
plan's last step is the final answer. Choose each model for what it is good at, split the work
only when that helps, and give the last step the job of stating the final answer clearly."""

LIST_FORMAT = """\
Think briefly about the task, then end your reply with exactly three Python lists of equal
length, one entry per step, steps numbered from 0:

model_id = [...]     # which model does each step (its id or its number in the pool)
subtasks = [...]     # the instruction for each step, in plain language
access_list = [...]  # which earlier steps each step may read: "all", [] for none,
                     # or a list of earlier step numbers such as [0, 2]

Use at most {max_steps} steps. A step may read only earlier steps."""

# The bare form's prompt is the role and the format said once, briefly: it is written for a tiny
# conductor under a JSON schema, which already fixes the plan's syntax, and its prompt is paid
# on every plan (58 fewer SmolLM2 tokens than the full role and format: a trained conductor's
# own plan call is then ~200 tokens, not ~260; docs/results/learning.md).
BARE_ROLE = """\
You are the conductor: plan the task for the models in the pool, do not answer it yourself.
Split the work only when that helps; the last step's output is the final answer."""

BARE_FORMAT = """\
Reply with {{"steps": [...]}}, at most {max_steps} steps, each with "agent" (an id from the pool),
"subtask" (its instruction) and "access" (the earlier steps it reads: "all", [] or their numbers
from 0)."""

REASONING_JSON_FORMAT = """\
Reply with a JSON object {{"reasoning": "...", "steps": [...]}}. First think in "reasoning"
(at most {reasoning_max_chars} characters): what the task needs, which models in the pool suit
which parts, and whether splitting the work helps. Then give "steps": at most {max_steps} step
objects, each with "agent" (a model id from the pool), "subtask" (the instruction, as detailed
as the model needs) and "access" ("all", [] for none, or a list of earlier step numbers counted
from 0). A step may read only earlier steps."""

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
    """The pool as the conductor sees it: each agent numbered, with its id and description.

    Numbered from 0, as the paper numbers its workers, because everything else the conductor
    counts starts at 0 too: the plan is Python lists, and steps in access lists are 0-based.
    One counting rule means a number in model_id is never off by one. parse_plan maps number n
    to the n-th agent given here, so its caller passes the ids in this same order.
    """
    return "\n".join(
        f"{n}. {a.id}: {a.description or a.model}" for n, a in enumerate(agents)
    )


def conductor_messages(
    question: str,
    agents: Sequence[AgentSpec],
    *,
    max_steps: int,
    json_mode: bool,
    reasoning_max_chars: int | None = None,
    context: Sequence[SeenStep] = (),
    previous: Sequence[tuple[Plan, str]] = (),
    last_error: str | None = None,
    outer_question: str | None = None,
) -> list[Message]:
    """The conductor's prompt for one plan attempt.

    `previous` holds (plan, final answer) of earlier rounds, for a refinement round; an empty
    plan then keeps the last answer. `last_error` is why the previous attempt did not parse.
    With `json_mode`, a `reasoning_max_chars` asks for the reasoning-first JSON object (the
    reasoning field of plan_json_schema); None asks for the bare {"steps": [...]}, under a
    shorter role and format (BARE_ROLE: the form for tiny conductors, cheapest in tokens). The
    free-text form always asks the conductor to think first, then write the lists.
    A self-call's sub-plan gets `outer_question` (the whole job) and `context` (what its step
    could see), so the conductor plans the part knowing the whole.
    """
    ids = [a.id for a in agents]
    a, b = ids[0], ids[1] if len(ids) > 1 else ids[0]
    role = CONDUCTOR_ROLE
    if not json_mode:
        fmt = LIST_FORMAT.format(max_steps=max_steps)
    elif reasoning_max_chars is None:
        role, fmt = BARE_ROLE, BARE_FORMAT.format(max_steps=max_steps)
    else:
        fmt = REASONING_JSON_FORMAT.format(
            max_steps=max_steps, reasoning_max_chars=reasoning_max_chars
        )
    system = "\n\n".join(
        [
            role,
            "The pool:\n" + pool_listing(agents),
            fmt,
            EXAMPLES.format(a=a, b=b) if not json_mode else "",
        ]
    ).strip()
    parts = []
    if outer_question:  # a self-call: plan the part, knowing the whole
        parts.append("The overall job (for context; plan only the task below, which is one "
                      f"part of it):\n{outer_question}")
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


def _steps(steps: Sequence[SeenStep]) -> str:
    return "\n\n".join(
        f"[step {s.index}, {s.agent}] Subtask: {s.subtask}\nResponse: {s.output}" for s in steps
    )


def agent_messages(
    question: str, subtask: str, seen: Sequence[SeenStep],
    *, outer_question: str | None = None, background: Sequence[SeenStep] = (),
) -> list[Message]:
    """An agent's prompt: the overall task, what it may see of earlier steps, its subtask.

    In a self-call's sub-plan, `outer_question` is the job the sub-plan's task is part of, so
    the agent answers its subtask in that context, and `background` is the parent step's view
    (granted to steps whose access is "all"; workflows/conduct.py)."""
    if outer_question:
        parts = [f"You are one member of a team working on this job:\n{outer_question}",
                 f"The team's current part of the job:\n{question}"]
    else:
        parts = [f"You are one member of a team working on this task:\n{question}"]
    if background:
        parts.append("Background from earlier work on the job that you may use:\n"
                     + _steps(background))
    if seen:
        parts.append("Work done so far by other members that you may use:\n" + _steps(seen))
    parts.append(f"Your subtask:\n{subtask}")
    parts.append("Answer the subtask directly and completely.")
    return [Message(role="user", content="\n\n".join(parts))]
