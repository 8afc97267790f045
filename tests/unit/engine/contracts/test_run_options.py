"""What a user sets and what the engine sets, apart (engine/contracts/tasks.py): `RunOptions`
holds the user's options only, a training run's sampling and a self-call's frame are built by
their own functions, and tasks as histories recorded them before the split (flat fields) still
read, into the new shape."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from pydantic import ValidationError

from conductor_engine.engine.contracts.tasks import (
    FLAT_FRAME_FIELDS,
    FLAT_SAMPLING_FIELDS,
    RolloutSampling,
    RunOptions,
    SelfCallFrame,
    Task,
    rollout_sampling,
    self_call_frame,
)
from tests.paths import TESTS

HISTORIES = TESTS / "integration" / "histories"


def _child_inputs(history: str) -> list[dict[str, Any]]:
    """The tasks a recorded workflow history started its run or its children with, as the
    JSON the payloads hold."""
    saved = json.loads((HISTORIES / f"{history}.json").read_text())
    out = []
    for event in saved["history"]["events"]:
        attrs = (event.get("startChildWorkflowExecutionInitiatedEventAttributes")
                 or event.get("workflowExecutionStartedEventAttributes") or {})
        for payload in attrs.get("input", {}).get("payloads", []):
            value = json.loads(base64.b64decode(payload["data"]))
            if isinstance(value, dict) and "question" in value:
                out.append(value)
    return out


def test_run_options_hold_none_of_the_fields_the_engine_sets() -> None:
    assert not set(RunOptions.model_fields) & {*FLAT_SAMPLING_FIELDS, *FLAT_FRAME_FIELDS}
    assert not set(Task.model_fields) & set(FLAT_FRAME_FIELDS)
    task = Task(question="q")
    assert task.sampling == RolloutSampling() and task.frame == SelfCallFrame()


def test_a_rollout_recorded_with_flat_options_reads_into_its_sampling() -> None:
    """A training iteration's second rollout of t0, as the v4 history's child input holds it
    (`"sample": 1` among the options)."""
    [old] = [t for t in _child_inputs("v4_train") if t["options"].get("sample") == 1
             and t["id"] == "t0"]
    task = Task.model_validate(old)
    assert task.sampling == RolloutSampling(sample=1)
    assert task.options.result == "summary" and task.options.policy_version == 0  # "base"
    assert task.frame == SelfCallFrame()
    assert "sample" not in task.options.model_dump()
    assert Task.model_validate_json(task.model_dump_json()) == task


def test_a_self_call_recorded_with_a_flat_depth_reads_into_its_frame() -> None:
    [old] = _child_inputs("v3_conduct_child")
    assert old["depth"] == 1
    task = Task.model_validate(old)
    assert task.frame == SelfCallFrame(depth=1) and task.question == "Gather the facts."


def test_every_old_flat_field_reads_into_the_new_shape() -> None:
    """The same recorded payload with every flat field a later history could carry."""
    [old] = [t for t in _child_inputs("v4_train") if t["options"].get("sample") == 1][:1]
    old = {**old, "depth": 2, "outer_question": "Which is larger?",
           "options": {**old["options"], "seeded": True, "explore": 0.1,
                       "explore_importance": True}}
    task = Task.model_validate(old)
    assert task.frame == SelfCallFrame(depth=2, outer_question="Which is larger?")
    assert task.sampling == RolloutSampling(sample=1, seeded=True, explore=0.1,
                                            explore_importance=True)
    with pytest.raises(ValidationError, match="give Task field 'frame' or its old flat fields"):
        Task.model_validate({**old, "frame": {"depth": 1}})


def test_a_rollouts_sampling_is_seeded_so_a_group_is_the_same_whatever_the_load() -> None:
    assert rollout_sampling(3, explore=0.2) == RolloutSampling(sample=3, seeded=True,
                                                               explore=0.2)
    with pytest.raises(ValidationError):
        rollout_sampling(-1)


def test_a_self_calls_frame_is_one_deeper_and_keeps_the_outermost_question() -> None:
    user = Task(question="The whole job")
    child = Task(question="Part one", frame=self_call_frame(user))
    grandchild = Task(question="Part of part one", frame=self_call_frame(child))
    assert child.frame == SelfCallFrame(depth=1, outer_question="The whole job")
    assert grandchild.frame == SelfCallFrame(depth=2, outer_question="The whole job")
