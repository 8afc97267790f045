"""A worker runs only as many plan attempts at once as its conductor serves (`plan_slots` in
the settings; 0: runtime/worker.py `plan_slots`), on the plans queue (`plans_task_queue`). The
plans beyond wait in Temporal, shown as scheduled, where their plan timeout does not run; inside
a worker they would wait behind the conductor with it running, and on a busy machine fail as
`plan_failed`. The conductor holds every plan it is asked for (tests/faults/gate.py), so what
is counted does not depend on timing. Waiting counts towards a plan's deadline (schedule-to-
close: `step_deadline_s`, or `plan_deadline_s`, which a training run gives its own runs)."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import Client, WorkflowFailureError

from conductor_engine.engine.contracts.names import PLAN_ACTIVITY
from conductor_engine.engine.contracts.records import RunResult
from conductor_engine.engine.contracts.tasks import RunOptions, Task
from conductor_engine.engine.providers.pool import Pool
from conductor_engine.engine.settings import Settings
from conductor_engine.runtime.client import ConductorClient
from conductor_engine.runtime.worker import plan_slots
from tests.conftest import make_pool, running_worker
from tests.faults.gate import Gate
from tests.plans import plan_json

SLOTS, RUNS = 2, 6
SCHEDULED = PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED
STARTED = PendingActivityState.PENDING_ACTIVITY_STATE_STARTED


async def _plan_states(client: Client, workflow_ids: list[str]) -> list[int]:
    """The state of each run's pending plan activity (none yet: left out)."""
    states = []
    for wid in workflow_ids:
        desc = await client.get_workflow_handle(wid).describe()
        states += [a.state for a in desc.raw_description.pending_activities
                   if a.activity_type.name == PLAN_ACTIVITY]
    return states


async def test_plans_beyond_the_conductors_slots_wait_in_temporal_as_scheduled(
    agent_server, client: Client, settings: Settings,
) -> None:
    gate = Gate()
    agent_server.set_responder("conductor", gate(lambda _: plan_json(("gpt", "Compute.", []))))
    agent_server.set_responder("gpt", lambda _: "1024")
    gate.close()
    settings.plan_slots = SLOTS
    async with running_worker(client, settings, make_pool(agent_server)):
        conductor = ConductorClient(client, settings)
        ids = [await conductor.submit(Task(question=f"What is 2^10? (run {i})",
                                           reference="1024")) for i in range(RUNS)]

        async def settled() -> list[int]:
            while True:  # until every run asked for its plan, and the gate holds what started
                states = await _plan_states(client, ids)
                if len(states) == RUNS and gate.holding == states.count(STARTED) == SLOTS:
                    return states
                await asyncio.sleep(0.1)

        states = await asyncio.wait_for(settled(), timeout=120)
        gate.open()
        results = [await client.get_workflow_handle(wid, result_type=RunResult).result()
                   for wid in ids]

    assert states.count(SCHEDULED) == RUNS - SLOTS, "the plans beyond the slots wait in Temporal"
    assert gate.peak == SLOTS, "the conductor was never asked for more plans than the slots"
    assert [r.status for r in results] == ["completed"] * RUNS
    assert all(r.reward is not None and r.reward.value == 1.0 for r in results)


DEADLINE_S = 10.0  # also the patient run's agent step's: generous on a busy machine


async def test_a_plan_waiting_for_a_slot_fails_at_its_deadline_unless_given_a_longer_one(
    agent_server, client: Client, settings: Settings,
) -> None:
    """One slot, held by a first run's plan. A second run's plan waits in Temporal past its
    step deadline and the run fails, the deadline named; a third's, with `plan_deadline_s` (what
    a training run gives its rollouts), waits as long and longer, and completes once the slot
    is free. Whatever the machine's speed, the third has waited past the step deadline when the
    gate opens: it was scheduled before the second failed, and the gate opens a deadline later."""
    gate = Gate()
    agent_server.set_responder("conductor", gate(lambda _: plan_json(("gpt", "Compute.", []))))
    agent_server.set_responder("gpt", lambda _: "1024")
    gate.close()
    settings.plan_slots = 1
    short = RunOptions(step_deadline_s=DEADLINE_S)
    async with running_worker(client, settings, make_pool(agent_server)):
        conductor = ConductorClient(client, settings)

        async def until(check) -> None:  # type: ignore[no-untyped-def]
            while not await check():
                await asyncio.sleep(0.1)

        first = await conductor.submit(Task(question="What is 2^10? (first)", reference="1024"))

        async def held() -> bool:
            return gate.holding == 1

        await asyncio.wait_for(until(held), timeout=120)
        bounded = await conductor.submit(Task(question="What is 2^10? (bounded)",
                                              reference="1024", options=short))
        patient = await conductor.submit(Task(
            question="What is 2^10? (patient)", reference="1024",
            options=short.model_copy(update={"plan_deadline_s": 3600.0})))

        async def both_scheduled() -> bool:
            return await _plan_states(client, [bounded, patient]) == [SCHEDULED, SCHEDULED]

        await asyncio.wait_for(until(both_scheduled), timeout=120)
        with pytest.raises(WorkflowFailureError) as failed:
            await client.get_workflow_handle(bounded, result_type=RunResult).result()
        await asyncio.sleep(DEADLINE_S)
        assert await _plan_states(client, [patient]) == [SCHEDULED], "still waiting, not failed"
        gate.open()
        done = [await client.get_workflow_handle(wid, result_type=RunResult).result()
                for wid in (first, patient)]

    reason = str(failed.value.cause)
    assert "PlanFailed" in repr(failed.value.cause) or "planning round 1 failed" in reason
    assert "deadline passed" in reason and "plan_deadline_s" in reason, reason
    assert [r.status for r in done] == ["completed", "completed"]


def test_a_local_conductor_gets_one_generation_batch_of_plan_slots(agent_server) -> None:
    from conductor_engine.engine.providers.local import batching

    served = make_pool(agent_server)
    local = Pool.model_validate({
        **served.model_dump(mode="json"),
        "conductor": {"id": "conductor", "provider": "local", "model": "SmolLM2-135M"},
    })
    assert plan_slots(local, 200) == batching.queue.max_batch
    assert plan_slots(local, 4) == min(4, batching.queue.max_batch)
    assert plan_slots(served, 200) == 200, "a served conductor batches on its own side"
