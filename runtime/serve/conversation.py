"""A chat request as the conductor's task: the last message (a user's) is the question, and
the messages before it are the task's context, which the conductor sees as background when it
plans (and steps whose access is "all" see too), each one labelled with its role.
"""

from __future__ import annotations

import uuid

from conductor_engine.engine.contracts.tasks import RunOptions, SeenStep, Task
from conductor_engine.engine.tasks.checks import check_size, check_storable
from conductor_engine.runtime.serve.wire import ChatRequest


class BadRequest(ValueError):
    """A request the conductor cannot run; the message says what to change."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def chat_task(request: ChatRequest, policy_version: str | None) -> Task:
    """The task one chat request runs (a fresh id each time: `conduct-chat-...`). BadRequest
    for a conversation the conductor cannot run; TaskTooLarge for one over MAX_TASK_BYTES."""
    last = request.messages[-1]
    if last.role != "user":
        raise BadRequest(f"the last message must be the user's (the task), not {last.role!r}",
                         "messages")
    if not last.text.strip():
        raise BadRequest("the last message is empty: it is the task, so it needs text",
                         "messages")
    context = [SeenStep(index=i, agent=m.role, subtask=f"message {i + 1} of the conversation",
                           output=m.text)
               for i, m in enumerate(request.messages[:-1]) if m.text.strip()]
    options = RunOptions(policy_version=policy_version)
    if request.temperature is not None:
        options.temperature = request.temperature
    fields = {"id": f"chat-{uuid.uuid4().hex[:16]}", "question": last.text, "context": context,
              "options": options, "tags": ["serve"]}
    try:
        check_storable(fields)
    except ValueError as e:
        raise BadRequest(str(e), "messages") from None
    task = Task.model_validate(fields)
    check_size(task, "this conversation", "shorten the messages")
    return task
