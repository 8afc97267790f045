"""The policy version (engine/contracts/policy_versions.py): one type from a training run to the
worker that serves it, an int in code and its label in JSON, reading what older histories wrote."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from conductor_engine.engine.contracts.agents import AgentSpec
from conductor_engine.engine.contracts.policy_versions import (
    BASE,
    LATEST,
    parse_version,
    version_label,
)
from conductor_engine.engine.contracts.tasks import RunOptions
from conductor_engine.engine.contracts.training import UpdateRequest
from conductor_engine.engine.contracts.training_runs import TrainProgress


def test_version_labels_round_trip() -> None:
    assert [version_label(v) for v in (0, 1, 12)] == [BASE, "v1", "v12"]
    assert version_label(LATEST) == LATEST
    assert [parse_version(s) for s in ("base", "v3", "3", 3, "latest")] == [0, 3, 3, 3, None]
    for bad in ("newest", "v", "v1234567890", "V3", "-1"):
        with pytest.raises(ValueError, match="not 'base', 'latest', or vN"):
            parse_version(bad)


def test_a_version_is_an_int_in_code_and_its_label_in_json() -> None:
    progress = TrainProgress(version=3)
    assert progress.version == 3 and progress.label == "v3"
    assert progress.model_dump()["version"] == 3
    assert progress.model_dump(mode="json")["version"] == "v3"
    assert TrainProgress.model_validate_json(progress.model_dump_json()).version == 3
    assert TrainProgress().model_dump(mode="json")["version"] == BASE


def test_what_older_histories_wrote_still_reads() -> None:
    # TrainProgress and UpdateRequest wrote the version as a number; RunOptions as a label,
    # with or without the v
    assert TrainProgress.model_validate({"version": 2}).version == 2
    assert UpdateRequest.model_validate({"name": "c", "parent": 4, "update_id": "u"}).parent == 4
    for written, pinned in (("v3", 3), ("3", 3), ("base", 0), ("latest", LATEST), (None, None)):
        assert RunOptions.model_validate({"policy_version": written}).policy_version == pinned


def test_a_training_run_pins_its_rollouts_with_the_version_itself() -> None:
    # the workflow passes TrainProgress.version to RunOptions unchanged; the worker reads the
    # same int, and the payload between them is the label the traces record
    progress = TrainProgress(version=5)
    options = RunOptions(policy_version=progress.version)
    assert options.policy_version == 5
    assert options.model_dump(mode="json")["policy_version"] == "v5"
    assert RunOptions.model_validate_json(options.model_dump_json()).policy_version == 5


def test_a_version_that_is_no_version_is_refused_in_one_line() -> None:
    with pytest.raises(ValidationError, match="policy version 'newest' is not 'base', 'latest'"):
        RunOptions(policy_version="newest")
    with pytest.raises(ValidationError, match="'latest' is a pin, not a version"):
        TrainProgress(version="latest")
    with pytest.raises(ValidationError, match="negative"):
        UpdateRequest(name="c", parent=-1, update_id="u")


def test_a_pool_file_pins_the_conductor_with_the_same_type() -> None:
    def spec(**fields: object) -> AgentSpec:
        return AgentSpec.model_validate({"id": "c", "provider": "local", "model": "m", **fields})

    assert spec().policy_version == LATEST
    assert spec(policy_version="v2").policy_version == 2
    assert spec(policy_version="base").model_dump(mode="json")["policy_version"] == BASE
    with pytest.raises(ValidationError, match="not 'base', 'latest', or vN"):
        spec(policy_version="v2.1")
