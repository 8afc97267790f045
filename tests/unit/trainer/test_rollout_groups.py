"""Honest GRPO groups, no service needed: which runs are rollouts and why the others are left
out, how a stored run that retried its plan is taken, how a group forms from what is left, and
how trace content that looks like a blob reference stays data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conductor_engine.engine.contracts.agent_calls import Message
from conductor_engine.engine.contracts.records import PlanAttempt, RoundRecord
from conductor_engine.engine.contracts.rewards import Reward, RewardWeights, Verdict
from conductor_engine.engine.contracts.traces import Trace
from conductor_engine.engine.plan.language import parse_plan
from conductor_engine.engine.rewards import score_run
from conductor_engine.engine.rewards.rollouts import (
    Group,
    LeftOut,
    as_rollout,
    count_reasons,
    describe_counts,
    failure_reason,
    left_out_reason,
    merge_counts,
)
from conductor_engine.engine.storage.blob_refs import (
    decode,
    encode,
    is_blob_ref,
    may_hold_blob_keys,
    refs_in,
)
from conductor_engine.engine.storage.blobs import (
    BlobStoreError,
    LocalBlobStore,
    checked_key,
    is_ref,
    key_for,
    ref_for,
)
from conductor_engine.engine.storage.payloads import BlobStoreDriverClient
from conductor_engine.trainer.rollouts import group_stats
from tests.plans import plan_json
from tests.traces import make_trace

HEX = "ab" * 32


def reward(value: float | None, *, details: dict[str, object] | None = None,
           reason: str = "checked") -> Reward:
    verdict = Verdict(verifier="math", correct=value == 1.0, score=value or 0.0, reason=reason,
                      details=details or {})
    return Reward(value=value, verdict=verdict, reason=reason)


# --- which runs are rollouts ---------------------------------------------------------------


@pytest.mark.parametrize(("status", "rew", "failure", "expected"), [
    ("completed", reward(1.0), None, None),
    ("completed", reward(0.5), None, None),
    ("invalid_plan", Reward(value=0.0, reason="invalid plan"), None, None),  # the policy's own
    ("failed", Reward(value=0.0, reason="run failed"), "StepFailed", "step_failed"),
    ("failed", Reward(value=0.0, reason="run failed"), "PlanFailed", "plan_failed"),
    ("failed", None, None, "run_failed"),
    ("cancelled", Reward(value=0.0, reason="run cancelled"), None, "cancelled"),
    ("completed", None, None, "no_reward"),
    ("completed", Reward(value=None, reason="no reference answer"), None, "no_reward"),
    ("completed", reward(0.0, details={"error": "sandbox died"}), None, "verifier_error"),
    ("completed", Reward(value=0.0, reason="verifier error: RuntimeError: boom"), None,
     "verifier_error"),
    ("completed", reward(1.0, details={"trusted": False}), None, "untrusted"),
    ("completed", reward(1.0, details={"trusted": True}), None, None),
])
def test_a_run_is_a_rollout_unless_infrastructure_decided_its_reward(
    status: str, rew: Reward | None, failure: str | None, expected: str | None,
) -> None:
    assert left_out_reason(status, rew, failure) == expected


def test_the_scorer_s_own_verifier_errors_are_recognised() -> None:
    """What engine/rewards produces for a verifier failure is what the classifier leaves out."""
    broken = score_run("completed", "B", "42", "choice")  # the reference is no letter
    assert broken.value == 0.0 and left_out_reason("completed", broken) == "verifier_error"
    wrong = score_run("completed", "41", "42", "exact")
    assert wrong.value == 0.5 and left_out_reason("completed", wrong) is None


def test_failure_types_and_counts_read_plainly() -> None:
    assert failure_reason("StepFailed") == "step_failed" and failure_reason(None) == "run_failed"
    counts = count_reasons(["step_failed", "verifier_error", "verifier_error"])
    assert list(counts.items()) == [("verifier_error", 2), ("step_failed", 1)]
    assert merge_counts(counts, {"step_failed": 2}) == {"step_failed": 3, "verifier_error": 2}
    assert describe_counts(counts) == "3 (verifier_error 2, step_failed 1)"
    assert describe_counts({}) == "0"


# --- stored runs that retried their plan ---------------------------------------------------


def attempt(n: int, ok: bool, feedback: str | None = None) -> PlanAttempt:
    text = plan_json(("gpt", "Answer.", [])) if ok else "no plan here"
    prompt = [Message(role="user", content="Task: 2+2?" + (f"\n{feedback}" if feedback else ""))]
    return PlanAttempt(attempt=n, raw_text=text, prompt=prompt, cost_usd=0.01,
                       plan=parse_plan(text, ["gpt"]) if ok else None,
                       error=None if ok else "not a valid plan")


def test_a_run_whose_first_plan_was_retried_is_trained_as_the_invalid_plan_it_began_with() -> None:
    trace = make_trace("retried", reward=1.0)
    rnd = trace.rounds[0]
    rnd.attempts = [attempt(1, False), attempt(2, True, feedback="not a valid plan: fix it")]
    rollout = as_rollout(trace)
    assert isinstance(rollout, Trace)
    assert rollout.status == "invalid_plan" and rollout.answer is None
    assert rollout.reward is not None and rollout.reward.value == 0.0
    assert "first of 2 attempts" in rollout.reward.reason
    [only] = rollout.rounds
    assert only.attempts == [rnd.attempts[0]] and not only.steps
    assert "fix it" not in only.attempts[0].prompt[0].content, "no feedback is trained on"
    assert (rollout.workflow_id, rollout.run_id) == (trace.workflow_id, trace.run_id)
    weights = trace.model_copy(deep=True)  # the task's own weights score it
    weights.task.options.reward = RewardWeights(invalid_plan=-1.0)
    again = as_rollout(weights)
    assert isinstance(again, Trace) and again.reward and again.reward.value == -1.0


def test_a_retried_refinement_round_is_left_out_and_a_clean_run_is_itself() -> None:
    trace = make_trace("refined")
    assert as_rollout(trace) is trace
    trace.rounds.append(RoundRecord(index=1, attempts=[attempt(1, False), attempt(2, True)]))
    assert as_rollout(trace) == "plan_retried"


def test_a_retried_first_plan_without_a_reference_has_no_reward_to_train_on() -> None:
    trace = make_trace("no-ref")
    trace.task.reference = None
    trace.rounds[0].attempts = [attempt(1, False), attempt(2, True)]
    assert as_rollout(trace) == "no_reward"


# --- groups ------------------------------------------------------------------------------


def group(rewards: list[float], left: list[str]) -> Group:
    traces = [make_trace("g", reward=r) for r in rewards]
    return Group(task_id="g", policy=traces[0].policy if traces else make_trace("g").policy,
                 traces=traces, left_out=[LeftOut(workflow_id=f"w{i}", run_id="r", reason=x)
                                          for i, x in enumerate(left)])  # type: ignore[arg-type]


def test_a_group_is_its_rollouts_and_counts_the_rest() -> None:
    g = group([1.0, 0.5, 1.0], ["step_failed", "verifier_error"])
    assert g.trainable and g.rewards == [1.0, 0.5, 1.0] and len(g.runs) == 5
    assert g.left_out_counts() == {"step_failed": 1, "verifier_error": 1}
    small = group([1.0], ["step_failed"] * 3)
    assert not small.trainable
    assert small.left_out_counts() == {"step_failed": 3, "too_few_left": 1}
    stats = group_stats([(g, 0), (small, 0)])
    assert (stats.groups, stats.rollouts) == (1, 3), "figures over the groups that train"
    assert stats.mean_reward == pytest.approx(2.5 / 3)
    assert stats.left_out == {"step_failed": 4, "too_few_left": 1, "verifier_error": 1}


def test_advantages_are_over_the_rollouts_only() -> None:
    pytest.importorskip("transformers")
    from conductor_engine.engine.contracts.training import RolloutConfig
    from conductor_engine.trainer.grpo import group_advantages
    from conductor_engine.trainer.rollouts import group_samples
    from tests.grpo_inputs import tiny_tokenizer

    g = group([1.0, 0.5, 1.0, 0.5], ["step_failed"] * 4)
    for t in g.traces:
        t.rounds[0].attempts[0].prompt = [Message(role="user", content="w1 w2")]
    cfg = RolloutConfig(group_size=8, scale_rewards=False)
    samples = group_samples(g, 0, tiny_tokenizer(), cfg)
    assert [s.advantage for s in samples] == [0.25, -0.25, 0.25, -0.25]
    assert [s.advantage for s in samples] == group_advantages([1.0, 0.5, 1.0, 0.5], scale=False)
    assert group_samples(group([1.0], ["step_failed"]), 0, tiny_tokenizer(), cfg) == []



@pytest.mark.parametrize("scale", [False, True])
def test_a_batch_baseline_gives_a_group_that_all_failed_a_signal(scale: bool) -> None:
    """Under GRPO's group baseline a group whose rollouts all failed trains nothing; measured
    against the update's other rollouts its choices are pushed down (recipe `baseline`)."""
    pytest.importorskip("transformers")
    from conductor_engine.engine.contracts.training import RolloutConfig
    from conductor_engine.trainer.grpo import batch_advantages
    from conductor_engine.trainer.rollouts import update_samples
    from tests.grpo_inputs import tiny_tokenizer

    failed, mixed = group([0.0, 0.0], []), group([1.0, 0.0], [])
    small = group([1.0], ["step_failed"] * 3)  # too few left: takes no part
    for g in (failed, mixed, small):
        for t in g.traces:
            t.rounds[0].attempts[0].prompt = [Message(role="user", content="w1 w2")]
    groups = [(failed, 0), (small, 0), (mixed, 0)]
    by_group = update_samples(groups, tiny_tokenizer(), RolloutConfig(
        group_size=2, scale_rewards=scale))
    by_batch = update_samples(groups, tiny_tokenizer(), RolloutConfig(
        group_size=2, scale_rewards=scale, baseline="batch"))
    assert [s.advantage for s in by_group][:2] == [0.0, 0.0]
    expected = batch_advantages([[0.0, 0.0], [1.0, 0.0]], scale=scale)  # not the small group's
    assert [s.advantage for s in by_batch] == [a for g in expected for a in g]
    assert by_batch[0].advantage < 0 and by_batch[2].advantage > 0
    assert sum(s.advantage for s in by_batch) == pytest.approx(0.0)

# --- blob references in trace documents ----------------------------------------------------


FORGED = [
    {"$blob": "sha256:../../etc/passwd"},
    {"$blob": f"sha256:{HEX}", "bytes": 5, "preview": "hello"},  # exactly a ref's shape
    {"$$blob": "already escaped?", "$blob": 1},
    {"$$$blob": [1, {"$blob": None}]},
    [1, "two", {"$blob": f"sha256:{HEX}\n", "bytes": 1, "preview": ""}],
]


@pytest.mark.parametrize("content", FORGED)
def test_content_shaped_like_a_blob_reference_round_trips_as_data(content: object) -> None:
    doc = {"rounds": [{"output": "x" * 100, "details": content}], "answer": "y" * 5000}
    raw = json.dumps(doc).encode()
    assert may_hold_blob_keys(raw)
    encoded = encode(json.loads(raw), threshold=1024)
    assert list(encoded.blobs) == [ref_for(b"y" * 5000)], "the store's refs are the only refs"
    assert refs_in(encoded.doc) == set(encoded.blobs)
    stored = json.loads(json.dumps(encoded.doc))  # through JSON, as PostgreSQL keeps it
    assert decode(stored, {ref_for(b"y" * 5000): "y" * 5000}) == doc
    unresolved = decode(stored, None)
    assert is_blob_ref(unresolved["answer"]) and unresolved["rounds"] == doc["rounds"]


def test_a_document_without_such_keys_is_stored_unwalked() -> None:
    doc = {"output": 'the agent wrote {"$blob": "sha256:x"} as text', "n": [1, 2]}
    assert not may_hold_blob_keys(json.dumps(doc).encode())
    assert decode(doc, {}) == doc


def test_an_old_document_keeps_its_keys_and_only_exact_refs_resolve() -> None:
    """Rows written before escaping: no mark, so no key is unescaped, and a "$blob" dict that is
    not exactly what the store writes stays literal."""
    real = {"$blob": f"sha256:{HEX}", "bytes": 4, "preview": "text"}
    old = {"details": {"$blob": "sha256:../..", "$$blob": "kept"}, "output": real}
    assert refs_in(old) == {f"sha256:{HEX}"}
    assert decode(old, {f"sha256:{HEX}": "text"}) == {
        "details": {"$blob": "sha256:../..", "$$blob": "kept"}, "output": "text"}
    for bad in ({**real, "extra": 1}, {**real, "bytes": "4"}, {**real, "bytes": True},
                {**real, "$blob": f"sha256:{HEX.upper()}"}, {**real, "$blob": f"sha512:{HEX}"}):
        assert not is_blob_ref(bad) and decode({"d": bad}, {}) == {"d": bad}


def test_refs_and_keys_that_could_reach_a_path_are_refused() -> None:
    assert is_ref(f"sha256:{HEX}")
    for bad in (f"sha256:{HEX}\n", "sha256:../..", f"sha256:{HEX}/..", "", None, 3):
        assert not is_ref(bad)
    with pytest.raises(ValueError, match="not a blob reference"):
        key_for(f"sha256:{HEX}\n")
    assert checked_key("sha256/ab/cd") == "sha256/ab/cd"
    for key in ("../x", "/etc/passwd", "a//b", "a/./b", "a/..", "a\\b", "a\x00b", "a\nb", ""):
        with pytest.raises(ValueError, match="invalid blob key"):
            checked_key(key)


def test_payload_keys_must_be_the_driver_s_and_dot_segments_never_climb(tmp_path: Path) -> None:
    client = BlobStoreDriverClient(LocalBlobStore(tmp_path), "local")
    key = client._key("local", "v0/ns/default/wi/../ri/./d/sha256/" + HEX)
    assert key == f"temporal/v0/ns/default/wi/%2E%2E/ri/%2E/d/sha256/{HEX}"
    assert client._key("local", "v0/../../etc") == "temporal/v0/%2E%2E/%2E%2E/etc"
    for bad in ("v0//x", "/v0/x", "v0/a b", "v0/x\\y", "v0/x\n"):
        with pytest.raises(BlobStoreError, match="not one the storage driver writes"):
            client._key("local", bad)


# --- what `conductor train` shows ------------------------------------------------------------


def test_train_status_and_progress_say_how_many_runs_were_left_out_and_why() -> None:
    import io

    from rich.console import Console

    from conductor_engine.engine.contracts.training_runs import IterationStats
    from conductor_engine.runtime.cli.train import _iteration_line, history_table

    left = {"verifier_error": 4, "step_failed": 1}
    it = IterationStats(iteration=0, version="base", rollouts=7, left_out=left,
                        update_left_out={**left, "unreadable": 1}, mean_reward=0.5,
                        published="v1")
    clean = IterationStats(iteration=1, version="v1", rollouts=8)
    line = _iteration_line(it)
    assert "7 rollouts · left out 5 (verifier_error 4, step_failed 1)" in line
    assert "update left out 6 (verifier_error 4, step_failed 1, unreadable 1)" in line
    assert "left out" not in _iteration_line(clean)
    console = Console(width=200, file=io.StringIO(), color_system=None)
    console.print(history_table("run", [it, clean]))
    assert isinstance(console.file, io.StringIO)
    rows = console.file.getvalue().splitlines()
    assert "left out" in rows[2]
    assert any("5 (verifier_error 4, step_failed 1)" in r for r in rows)


@pytest.mark.parametrize(("sampled_at", "kept"), [(1.5, True), (1.0, False)],
                         ids=["same-temperature", "other-temperature"])
def test_a_run_sampled_at_another_temperature_trains_without_its_logprobs(
    sampled_at: float, kept: bool
) -> None:
    """Its recorded log-probs are of another distribution than the one the trainer scores at:
    dividing by them would skew every ratio, so that run's update is on-policy instead."""
    pytest.importorskip("transformers")
    from conductor_engine.engine.contracts.training import RolloutConfig
    from conductor_engine.trainer.rollouts import group_samples
    from tests.grpo_inputs import tiny_tokenizer

    g = group([1.0, 0.5], [])
    for t in g.traces:
        t.task.options.temperature = sampled_at
        t.rounds[0].attempts[0].prompt = [Message(role="user", content="w1 w2")]
    samples = group_samples(g, 0, tiny_tokenizer(), RolloutConfig(group_size=2), 1.5)
    assert len(samples) == 2
    assert all((s.behaviour_logprobs is not None) is kept for s in samples)
    assert all(s.completion_ids == list(range(120)) for s in samples), "the tokens stay"
