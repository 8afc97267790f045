"""Rollouts: complete GRPO groups from the trace store, turned into token-level samples.

A *group* is the G oldest finished root runs of one task under one policy version. The trainer
takes groups of the version it trains from, and of up to `max_staleness` versions before it
(older ones wait forever: they are never consumed); a group k versions old has its advantages
multiplied by `stale_discount ** k`. Only traces no published update has decided on are taken;
the registry marks every run of the chosen groups consumed, trained on or left out, in the same
transaction that publishes the new version.

Runs that are not honest rollouts (an infrastructure failure, a verifier error, no reward, an
unreadable trace: engine/rewards/rollouts.py) are left out of their group and counted by
reason, never scored 0; the group's advantages are over the rest. A group left with fewer than
MIN_GROUP rollouts trains nothing (its rollouts count as "too_few_left") but is consumed all the
same, and the selection reaches past it for a group that does train.

From each run the trainer takes the conductor's completions that decided the outcome: the plan
attempt of every round, one per round since a rollout gets one attempt (a stored run that retried
its first plan is trained as the invalid plan it started with: engine/rewards/rollouts.py
`as_rollout`). Each gets the run's group-relative advantage. Token ids and behaviour logprobs
come from the trace when the backend returned them; otherwise the raw text is tokenized again
and the update is on-policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from conductor_engine.engine.contracts.policy_versions import version_label
from conductor_engine.engine.contracts.records import PlanAttempt
from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.contracts.traces import PolicyRef, Trace
from conductor_engine.engine.contracts.training import RolloutConfig
from conductor_engine.engine.providers.local.chat import render_chat
from conductor_engine.engine.rewards.rollouts import Group, merge_counts, rollout_group
from conductor_engine.engine.storage.trace_store import TraceStore
from conductor_engine.trainer.grpo import (
    Sample,
    batch_advantages,
    group_advantages,
    misfit_choice,
)
from conductor_engine.trainer.grpo._shapes import ShapedRollout, shape_advantages, shaped_rollout


async def select_groups(
    store: TraceStore, name: str, version: int, cfg: RolloutConfig
) -> list[tuple[Group, int]]:
    """Up to `groups_per_update` unconsumed groups that train, newest version first, with their
    age; plus every group too small to train met on the way (consumed with them). In a fixed
    order (age, then task id; each group's rollouts by sample), so the same rollouts make the
    same update however the runs happened to finish."""
    picked: list[tuple[Group, int]] = []
    for age in range(0, min(cfg.max_staleness, version) + 1):
        room = cfg.groups_per_update - sum(g.trainable for g, _ in picked)
        if room <= 0:
            break
        found = await _trainable_first(
            store, PolicyRef(name=name, version=version_label(version - age)), cfg, room)
        picked.extend((g, age) for g in found)
    picked.sort(key=lambda p: (p[1], p[0].task_id))
    return [(in_sample_order(g), age) for g, age in picked]


def in_sample_order(group: Group) -> Group:
    """The group with its rollouts in sample order: the store lists them by finishing time,
    which depends on the machine's load, and the order of the samples decides the micro-batches
    and so the last bits of the update."""
    traces = sorted(group.traces, key=lambda t: (t.task.sampling.sample, t.workflow_id))
    return revised(group, traces=traces)


async def _trainable_first(store: TraceStore, policy: PolicyRef, cfg: RolloutConfig,
                           room: int) -> list[Group]:
    """The oldest groups up to `room` that train, and the too-small ones before them: asked
    again with a larger limit while too-small groups take the places (rare: a whole group
    failed)."""
    limit = room
    while True:
        found = [rollout_group(g) for g in await store.group_runs(
            policy, size=cfg.group_size, limit=limit, dataset=cfg.dataset,
            task_ids=cfg.task_ids, unconsumed=True)]
        trainable = sum(g.trainable for g in found)
        if trainable >= room or len(found) < limit:
            return found
        limit = room + (len(found) - trainable)


def deciding_attempts(trace: Trace) -> list[PlanAttempt]:
    """The conductor completions that decided the run: the last attempt of each round (a
    rollout's only one; see the module docstring for stored runs that retried)."""
    return [r.attempts[-1] for r in trace.rounds if r.attempts]


def update_samples(groups: Sequence[tuple[Group, int]], tokenizer: Any, cfg: RolloutConfig,
                   temperature: float = 1.0) -> list[Sample]:
    """The samples of an update's groups, with advantages against `cfg.baseline`: each group's
    own rollouts (GRPO) or every rollout of the update (trainer/grpo/_advantages.py
    `batch_advantages`); per token against the group's rollouts of the same plan shape with
    `cfg.credit` = "shape" (trainer/grpo/_shapes.py)."""
    if cfg.baseline == "group":
        return [s for g, age in groups for s in group_samples(g, age, tokenizer, cfg, temperature)]
    trained = [(g, age) for g, age in groups if g.trainable]
    advantages = batch_advantages([g.credited for g, _ in trained], scale=cfg.scale_rewards)
    return [s for (g, age), a in zip(trained, advantages, strict=True)
            for s in group_samples(g, age, tokenizer, cfg, temperature, advantages=a)]


def group_samples(
    group: Group, age: int, tokenizer: Any, cfg: RolloutConfig, temperature: float = 1.0,
    advantages: Sequence[float] | None = None,
) -> list[Sample]:
    """The samples of one group: group-relative advantages over its rollouts' credited rewards
    (their own, or their plans' means: `Group.credited`), or the `advantages` given, one per
    rollout; the runs left out take no part; none for a group too small to train.
    `temperature` is the one the trainer scores tokens at: a run sampled at another (a stored
    run trained with `--from-traces`) keeps its tokens but not its log-probs, which are in
    another distribution, so its update is on-policy."""
    if not group.trainable:
        return []
    if advantages is None:
        advantages = group_advantages(group.credited, scale=cfg.scale_rewards)
    weight = cfg.stale_discount**age
    out: list[Sample] = []
    shaped: list[ShapedRollout] = []
    for trace, advantage, reward in zip(group.traces, advantages, group.credited, strict=True):
        same = trace.task.options.temperature == temperature
        for attempt in deciding_attempts(trace):
            sample = attempt_sample(attempt, tokenizer, advantage * weight,
                                    behaviour_logprobs=same)
            if sample is not None:
                out.append(sample)
                if cfg.credit == "shape":
                    shaped.append(shaped_rollout(
                        [str(tokenizer.decode([t])) for t in sample.completion_ids],
                        reward, forced=trace.task.sampling.force_shape is not None))
    if cfg.credit == "shape":
        per_token = shape_advantages(shaped, scale=cfg.scale_rewards)
        for sample, row in zip(out, per_token, strict=True):
            sample.token_advantages = [a * weight for a in row]
    return out


def attempt_sample(attempt: PlanAttempt, tokenizer: Any, advantage: float, *,
                   behaviour_logprobs: bool = True) -> Sample | None:
    """One plan attempt as a Sample, or None when it has no prompt or no completion;
    without its log-probs when `behaviour_logprobs` is false."""
    if not attempt.prompt:
        return None
    prompt_ids = tokenizer(
        render_chat(tokenizer, attempt.prompt), add_special_tokens=False
    )["input_ids"]
    completion_ids = attempt.token_ids
    logprobs = attempt.logprobs
    forced_at = set(attempt.forced_positions or ())
    choices = attempt.choice_tokens
    if completion_ids is None:  # an API conductor: re-tokenize what it wrote
        completion_ids = tokenizer(attempt.raw_text, add_special_tokens=False)["input_ids"]
        if attempt.finish_reason == "stop" and tokenizer.eos_token_id is not None:
            completion_ids = [*completion_ids, tokenizer.eos_token_id]
        logprobs = None
        forced_at = set()
        choices = None
    if not completion_ids:
        return None
    if not behaviour_logprobs or (logprobs is not None and len(logprobs) != len(completion_ids)):
        logprobs = None
    if misfit_choice(choices, completion_ids) is not None:
        # not this completion's: its log-probs are in a space the trainer cannot rebuild
        choices, logprobs = None, None
    return Sample(
        prompt_ids=list(prompt_ids), completion_ids=list(completion_ids), advantage=advantage,
        behaviour_logprobs=logprobs, truncated=attempt.finish_reason == "length",
        forced=[k in forced_at for k in range(len(completion_ids))] if forced_at else None,
        choices=choices or None,
    )


class GroupStats(BaseModel):
    """What the groups of one update say about the policy that sampled them: figures over the
    rollouts of the groups that train; runs not trained on, by reason."""

    groups: int = 0
    rollouts: int = 0
    mean_reward: float | None = None
    valid_plan_rate: float | None = None
    tokens: int = 0
    left_out: dict[str, int] = Field(default_factory=dict)
    plan_runs: float | None = Field(
        default=None, description="[rollouts] reward = 'plan_mean': the stored runs behind "
        "each rollout's credited reward, on average (1: every rollout its own draw)")


def group_stats(groups: list[tuple[Group, int]]) -> GroupStats:
    left_out = merge_counts(*(g.left_out_counts() for g, _ in groups))
    trained = [g for g, _ in groups if g.trainable]
    traces = [t for g in trained for t in g.traces]
    if not traces:
        return GroupStats(left_out=left_out)
    rewards = [r for g in trained for r in g.rewards]
    means = [m.runs for g in trained for m in g.plan_means or []]
    return GroupStats(
        plan_runs=sum(means) / len(means) if means else None,
        groups=len(trained), rollouts=len(traces), mean_reward=sum(rewards) / len(rewards),
        valid_plan_rate=sum(t.valid_plan for t in traces) / len(traces),
        tokens=sum(t.totals.usage.input_tokens + t.totals.usage.output_tokens for t in traces),
        left_out=left_out,
    )
