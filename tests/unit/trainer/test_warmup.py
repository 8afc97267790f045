"""The warm-up on scored plans (trainer/warmup.py): which stored runs it learns from, and that its
supervised steps make the selected plans more likely under a real (tiny) policy."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from conductor_engine.engine.contracts.agent_calls import Message
from conductor_engine.engine.contracts.rewards import Verdict
from conductor_engine.engine.contracts.traces import PolicyRef, Trace
from conductor_engine.engine.contracts.training import (
    LossConfig,
    PolicyConfig,
    Recipe,
    WarmupConfig,
)
from tests.plans import plan_json
from tests.traces import make_trace

T0 = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def scored(task_id: str, reward: float, *, cost: float = 0.01, minute: int = 0,
           correct: bool | None = None, trusted: bool = True, conductor: str = "teacher",
           status: str = "completed") -> Trace:
    """A stored run of `task_id` with this reward, cost and verdict, its plan attempt prompted."""
    trace = make_trace(task_id, version="base", reward=reward,
                       finished=T0 + timedelta(minutes=minute))
    trace.policy = PolicyRef(name=conductor, version="base")
    trace.totals.cost_usd = cost
    trace.status = status  # type: ignore[assignment]
    assert trace.reward is not None
    details = {} if trusted else {"trusted": False}
    trace.reward.verdict = Verdict(verifier="exact", correct=reward >= 0.9 if correct is None
                                   else correct, score=reward, reason="checked",
                                   details=details)
    trace.rounds[0].attempts[0].prompt = [Message(role="user", content=f"Plan {task_id}.")]
    return trace


def test_the_best_run_of_each_training_task_is_chosen_by_reward_then_by_cost() -> None:
    from conductor_engine.trainer.warmup import select_plans

    runs = {
        "a-best": scored("a", 0.98, cost=0.02, minute=1),
        "a-same-dearer": scored("a", 0.98, cost=0.05, minute=0),
        "a-lower": scored("a", 0.95, cost=0.001, minute=2),
        "b-cheap": scored("b", 0.9, cost=0.001, minute=3),
        "b-same-later": scored("b", 0.9, cost=0.001, minute=4),
    }
    chosen = select_plans(runs.values(), ["a", "b"], WarmupConfig(per_task=1))
    assert [t.workflow_id for t in chosen.plans] == [runs["a-best"].workflow_id,
                                                     runs["b-cheap"].workflow_id]
    two = select_plans(runs.values(), ["a", "b"], WarmupConfig(per_task=2))
    assert [t.workflow_id for t in two.plans] == [
        runs[k].workflow_id for k in ("a-best", "a-same-dearer", "b-cheap", "b-same-later")]
    assert two.conductors() == {"teacher": 4} and two.tasks == 2


def test_untrusted_verdicts_wrong_answers_failed_runs_and_held_out_tasks_are_never_learned(
) -> None:
    from conductor_engine.trainer.warmup import select_plans

    forged = scored("a", 1.0, cost=0.0, trusted=False)  # the best reward, and forged
    honest = scored("a", 0.9, cost=0.5)
    wrong = scored("b", 0.25, correct=False)
    failed = scored("b", 1.0, status="failed")
    held_out = scored("heldout~c", 1.0)  # a held-out run of a task the run trains on
    other_task = scored("c", 1.0)  # c is held out: not in the training tasks
    other_conductor = scored("d", 1.0, conductor="someone")
    traces = [forged, honest, wrong, failed, held_out, other_task, other_conductor]
    chosen = select_plans(traces, ["a", "b", "d"], WarmupConfig(conductors=["teacher"]))
    assert [t.workflow_id for t in chosen.plans] == [honest.workflow_id]
    assert chosen.left_out == {"not_a_training_task": 2, "not_correct": 1,
                               "other_conductor": 1, "run_failed": 1, "untrusted": 1}
    # wrong answers may be learned when asked for, above a reward floor
    loose = select_plans(traces, ["b"], WarmupConfig(correct_only=False, min_reward=0.2))
    assert [t.workflow_id for t in loose.plans] == [wrong.workflow_id]
    assert select_plans(traces, ["b"], WarmupConfig(correct_only=False, min_reward=0.3)
                        ).plans == []


def test_the_warm_up_raises_the_log_prob_of_the_selected_plans_on_their_chosen_tokens(
    tiny_policy_dir: Path,
) -> None:
    """A few supervised steps on two plans of a tiny policy: each plan's mean log-prob per
    trained token rises, the tokens marked forced stay out of the loss, and a plan not selected
    for the same prompt gains less than the selected one."""
    import torch

    from conductor_engine.trainer.grpo import make_optimizer
    from conductor_engine.trainer.policy import load_policy
    from conductor_engine.trainer.warmup import (
        fine_tune,
        mean_logprob,
        sft_loss_config,
        warmup_samples,
    )

    recipe = Recipe(policy=PolicyConfig(base=str(tiny_policy_dir), lora=False, device="cpu"),
                    loss=LossConfig(micro_batch_size=4),
                    warmup=WarmupConfig(enabled=True, epochs=4, learning_rate=3e-3))
    torch.manual_seed(0)
    policy = load_policy(recipe.policy)
    tok = policy.tokenizer
    plans = [plan_json(("alpha", "Draft it.", []), ("bravo", "Check it.", [0])),
             plan_json(("charlie", "Answer.", []))]
    traces = []
    for task_id, text in zip(("a", "b"), plans, strict=True):
        trace = scored(task_id, 1.0)
        attempt = trace.rounds[0].attempts[0]
        attempt.raw_text = text
        attempt.token_ids = tok(text, add_special_tokens=False)["input_ids"]
        attempt.logprobs = None
        attempt.forced_positions = [0, 1, 2]  # as a grammar would record its forced text
        attempt.finish_reason = "stop"
        traces.append(trace)
    samples = warmup_samples(traces, tok, recipe.warmup)
    assert len(samples) == 2 and all(s.behaviour_logprobs is None for s in samples)
    assert all(s.trained_tokens == len(s.completion_ids) - 3 for s in samples)
    other = warmup_samples([scored("a", 1.0)], tok, recipe.warmup)[0]
    other.prompt_ids = samples[0].prompt_ids  # another plan for the first task's prompt
    other.completion_ids = tok(plan_json(("delta", "Guess.", "all")),
                               add_special_tokens=False)["input_ids"]
    other.forced = None
    cfg = sft_loss_config(recipe)
    pad = policy.pad_id
    optimizer = make_optimizer(policy.model, cfg)
    before_each = [mean_logprob(policy.model, [s], cfg, pad) for s in samples]
    other_before = mean_logprob(policy.model, [other], cfg, pad)
    tuned = fine_tune(policy.model, optimizer, samples, recipe, pad_id=pad)
    after_each = [mean_logprob(policy.model, [s], cfg, pad) for s in samples]
    other_after = mean_logprob(policy.model, [other], cfg, pad)
    print("log-prob per token", before_each, "->", after_each, "; not selected",
          other_before, "->", other_after)
    assert tuned.logprob_after > tuned.logprob_before + 0.5
    assert all(a > b + 0.3 for a, b in zip(after_each, before_each, strict=True))
    assert other_after - other_before < after_each[0] - before_each[0]
    assert tuned.step.steps == recipe.warmup.epochs and tuned.step.tokens == sum(
        s.trained_tokens for s in samples)
    assert tuned.step.loss == -tuned.logprob_after
