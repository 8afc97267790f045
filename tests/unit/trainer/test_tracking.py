"""The trainer's trackers: what an update is logged as, and a tracker that is not installed
is one clear line (once), never a failed update."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import structlog

from conductor_engine.engine.contracts.names import training_workflow_id, update_id
from conductor_engine.engine.contracts.training import UpdateRequest
from conductor_engine.trainer.tracking import Iteration, SamplePlan, Trackers, iteration_of


def test_an_update_is_logged_under_its_training_run_at_its_iteration() -> None:
    req = UpdateRequest(name="cond", parent=3,
                        update_id=update_id(training_workflow_id("sim"), "rid", 3))
    metrics = {"mean_reward": 0.75, "valid_plan_rate": 0.5, "loss": 0.1, "kl": 0.0,
               "clip_fraction": 0.2, "grad_norm": 1.5, "tokens": 400, "seconds": 2.0,
               "left_out": {"step_failed": 2}, "skipped": None}
    it = iteration_of(req, metrics, [])
    assert (it.run, it.step) == ("sim", 3)
    assert it.scalars["train/reward"] == 0.75 and it.scalars["train/tokens_per_s"] == 200.0
    assert it.scalars["left_out/step_failed"] == 2 and it.scalars["train/policy_version"] == 4
    by_hand = iteration_of(req.model_copy(update={"update_id": "manual-1"}), metrics, [])
    assert (by_hand.run, by_hand.step) == ("cond", 3)


def test_a_tracker_that_is_not_installed_is_one_line_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "trackio", None)  # `import trackio` raises ImportError
    trackers = Trackers(tmp_path)
    it = Iteration(run="r", step=0, scalars={"train/reward": 1.0},
                   samples=[SamplePlan("t1", 1.0, '{"steps": []}')])
    with structlog.testing.capture_logs() as logs:
        trackers.log(["trackio"], it)
        trackers.log(["trackio"], it)
    assert [entry["log_level"] for entry in logs] == ["error"]
    assert "pip install 'conductor-engine[trackio]'" in logs[0]["event"]
