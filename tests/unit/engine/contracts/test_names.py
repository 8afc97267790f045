"""Names and id formats: workflow histories and existing runs hold these exact strings."""

from __future__ import annotations

from conductor_engine.engine.contracts import names


def test_activity_workflow_and_queue_names_keep_their_recorded_values() -> None:
    assert (names.PLAN_ACTIVITY, names.AGENT_ACTIVITY, names.SCORE_ACTIVITY,
            names.RECORD_ACTIVITY, names.BATCH_REPORT_ACTIVITY, names.UPDATE_ACTIVITY) == (
        "write_plan", "call_agent", "score_run", "record_trace", "write_batch_report",
        "grpo_update")
    assert (names.CONDUCT_WORKFLOW, names.BATCH_WORKFLOW, names.TRAINING_WORKFLOW) == (
        "ConductWorkflow", "BatchWorkflow", "TrainingWorkflow")
    assert (names.PROGRESS_QUERY, names.STOP_SIGNAL) == ("progress", "stop")
    assert (names.TASK_QUEUE, names.TRAINER_TASK_QUEUE) == ("conductor", "trainer")


def test_ids_keep_their_formats() -> None:
    assert names.conduct_workflow_id("t1") == "conduct-t1"
    assert names.batch_workflow_id("nightly") == "batch-nightly"
    assert names.batch_child_workflow_id("nightly", "t1") == "batch-nightly/t1"
    assert names.training_workflow_id("run") == "train-run"
    assert names.rollout_workflow_id("run", "0a1b2c3d", 4, "t1", 7) == "train-run/0a1b2c3d/it4/t1/7"
    assert names.update_id("train-run", "rid", 4) == "train-run/rid/it4"
    assert names.self_call_id("conduct-t1", 1, 2) == "conduct-t1/r1s2"


def test_a_self_call_id_parses_back() -> None:
    child = names.self_call_id(names.self_call_id("conduct-t1", 0, 3), 2, 11)
    assert child == "conduct-t1/r0s3/r2s11"
    assert names.parse_self_call_id(child) == (2, 11)
    assert names.parse_self_call_id("batch-nightly/t1") is None
    assert names.parse_self_call_id("conduct-t1/r1s2x") is None


def test_an_update_id_names_its_training_run_and_iteration() -> None:
    made = names.update_id(names.training_workflow_id("sim-1.b"), "01a2-b3", 12)
    assert names.update_of(made) == ("sim-1.b", 12)
    assert names.update_of("by-hand-1") is None
    assert names.update_of("train-x/rid/itX") is None


def test_a_pools_queue_is_the_stem_and_a_fingerprint_of_the_whole_pool() -> None:
    """Equal pools meet on one queue whatever order their keys were read in; a pool that
    differs anywhere (an agent's model, a parameter, a description the conductor reads) gets
    another queue."""
    from conductor_engine.engine.providers.pool import Pool

    pool = Pool.load()
    spec = pool.model_dump(mode="json")
    queue = names.pool_task_queue("conductor", spec)
    assert queue == f"conductor-{names.pool_fingerprint(spec)}"
    assert len(queue) == len("conductor-") + names.POOL_FINGERPRINT_CHARS
    assert names.pool_task_queue("conductor", dict(reversed(spec.items()))) == queue
    assert names.pool_task_queue("conductor", Pool.load().model_dump(mode="json")) == queue
    first = pool.agents[0]
    for change in ({"model": first.model + "-next"}, {"description": "another"},
                   {"params": first.params.model_copy(update={"max_tokens": 7})}):
        other = pool.model_copy(update={"agents": [first.model_copy(update=change),
                                                   *pool.agents[1:]]})
        assert names.pool_task_queue("conductor", other.model_dump(mode="json")) != queue
    assert names.pool_task_queue("mine", spec).startswith("mine-")
