"""A gate in front of the agent server's answers, to take a fault at a moment when every model
call in flight is one the agent server is still holding, none half-delivered.

Temporal runs an activity at least once: a call whose answer reached a worker that died before
reporting it is rightly called again (a call in flight). A fault test that wants a figure that
does not depend on timing closes the gate, waits until each started model-call activity of the
batch is a request held at the gate (`quiet`), then strikes: no answer is in transit, so any
answer billed twice is the engine's fault, never the timing's."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from conductor_engine.engine.contracts.names import AGENT_ACTIVITY, PLAN_ACTIVITY

HOLD_S = 300.0  # a safety net: a held request is answered after this even if nobody opens


class Gate:
    def __init__(self) -> None:
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self.holding = 0
        self.peak = 0  # the most requests held at once

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    def __call__(self, answer: Callable[[str], str]) -> Callable[[str], str]:
        def gated(prompt: str) -> str:
            if not self._open.is_set():
                with self._lock:
                    self.holding += 1
                    self.peak = max(self.peak, self.holding)
                try:
                    self._open.wait(HOLD_S)
                finally:
                    with self._lock:
                        self.holding -= 1
            return answer(prompt)

        return gated

    async def quiet(self, client: Client, workflow_ids: Iterable[str]) -> bool:
        """Whether every started plan or agent activity of these workflows is held here."""
        started = 0
        for wid in workflow_ids:
            try:
                desc = await client.get_workflow_handle(wid).describe()
            except RPCError:
                continue
            if desc.status != WorkflowExecutionStatus.RUNNING:
                continue
            started += sum(
                a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
                and a.activity_type.name in (AGENT_ACTIVITY, PLAN_ACTIVITY)
                for a in desc.raw_description.pending_activities)
        with self._lock:
            return started == self.holding
