"""A plan's mean reward over its stored runs: what GRPO credits a rollout with under
`[rollouts] reward = "plan_mean"`, and how the warm-up tells plans apart (trainer/warmup.py).

A run's reward is one draw: the agents sample their answers, and on the structured sim pools
the same plan scored 0.99 and 0.24 in one group (docs/results/learning.md). With four rollouts
a task, the `,` that adds a second step is credited with noise about as large as the step's
worth, and GRPO after the warm-up unlearned plans the warm-up had taught. Given the plan, the
reward does not depend on the policy that wrote it (the agents answer the steps they are
given), so the mean over every stored run of the same task with the same plan estimates the
same E[R | plan] that one run does, with less noise: an unbiased, lower-variance reward for the
policy gradient. The runs counted are the training run's own: its rollouts of every version,
its warm-up's samples and the rehearsals of its candidate plans.

What "the same plan" is (`plan_signature`): each step's agent and which earlier steps it sees,
the subtasks' wording left out (the warm-up's comparison). Where the wording decides the
reward (a real pool's decomposition), `reward = "run"` credits each rollout's own draw.
Only runs whose reward is a function of the plan pool (`poolable`): one round, completed, no
self-call. A conductor that writes a second round saw the first one's answers, so runs that
share a two-round signature are conditioned on what the first round drew; a self-call's answer
is the policy's own. Such a rollout is credited with its own reward, and its run counts
towards no mean.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.contracts.traces import Trace
from conductor_engine.engine.rewards.rollouts import Group, PlanMean, as_rollout

Signature = tuple[tuple[tuple[str, tuple[int, ...]], ...], ...]
"""A run's plans as the warm-up compares them: per round, each step's agent and the earlier
steps it sees ("all" and the list of every earlier step are the same); not the subtasks."""


def plan_signature(trace: Trace) -> Signature:
    return tuple(tuple((s.agent, tuple(s.sees(i))) for i, s in enumerate(r.plan.steps))
                 for r in trace.rounds if r.plan is not None)


def poolable(trace: Trace) -> bool:
    """Whether this run's reward is a draw of its plan's alone: completed, one round with a
    plan, no self-call (see the module docstring), and an honest rollout (as GRPO's groups
    decide: no failure, no verifier error, no forgeable verdict, no retried plan)."""
    honest = as_rollout(trace)
    return (isinstance(honest, Trace) and honest.status == "completed"
            and len(honest.rounds) == 1 and honest.rounds[0].plan is not None
            and not honest.child_workflow_ids
            and honest.reward is not None and honest.reward.value is not None)


def plan_means(runs: Iterable[Trace]) -> dict[tuple[str, Signature], PlanMean]:
    """Each (task id, plan signature) among the poolable runs, with its mean reward. Summed in
    a fixed order (by workflow and run id), so the same stored runs give the same bits however
    the store listed them."""
    rewards: dict[tuple[str, Signature], list[tuple[str, str, float]]] = {}
    for trace in runs:
        if poolable(trace):
            assert trace.reward is not None and trace.reward.value is not None
            key = (trace.task.id, plan_signature(trace))
            rewards.setdefault(key, []).append(
                (trace.workflow_id, trace.run_id, trace.reward.value))
    return {key: PlanMean(mean=sum(r for *_, r in sorted(rs)) / len(rs), runs=len(rs))
            for key, rs in rewards.items()}


def credit(rollout: Trace, reward: float,
           means: dict[tuple[str, Signature], PlanMean]) -> PlanMean:
    """What a rollout is credited with: its plan's mean when the rollout is poolable and its
    plan has stored runs, else its own `reward` (as its group scored it)."""
    if poolable(rollout):
        found = means.get((rollout.task.id, plan_signature(rollout)))
        if found is not None:
            return found
    return PlanMean(mean=reward, runs=1)


def with_plan_means(groups: Sequence[tuple[Group, int]], runs: Iterable[Trace]
                    ) -> list[tuple[Group, int]]:
    """The groups with each rollout's credit (`Group.plan_means`) from these stored runs."""
    means = plan_means(runs)
    return [(revised(g, plan_means=[credit(t, r, means) for t, r in
                                    zip(g.traces, g.rewards, strict=True)]), age)
            for g, age in groups]
