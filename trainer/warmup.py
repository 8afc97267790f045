"""The warm-up: supervised fine-tuning on the best plans already executed and scored, before GRPO.

GRPO credits only what its rollouts wrote. A small conductor that ends every plan after one step
(SmolLM2-135M writes a second step with probability 0.001 to 0.004: docs/how-to/rehearse-plans.md)
never shows
GRPO a two-step plan to reward, however long it trains. Plans that paid when some conductor
wrote them do show it: a strong API model run as conductor over the training tasks, or the
policy's own exploring rollouts. The warm-up (`[warmup]` in the recipe, WarmupConfig) takes, for
each training task, the best N of its stored runs and fine-tunes the policy to write them; the
result is published as a version like any other, and GRPO continues from it.

Which runs (`select_plans`), per training task:
- only executed, scored runs from the trace store: never a task's reference or an oracle file,
  only the reward its verifier gave a run's answer;
- only the training tasks of the run (their ids): a held-out task's runs (`heldout~ID`) and any
  other task's are never read;
- only honest ones, as GRPO's groups decide (engine/rewards/rollouts.py `as_rollout`): no
  failed or cancelled run, no verifier error, no verdict the candidate could have forged, no
  run that needed retry feedback to write its plan; and a completed run, whose plan was valid;
- best first, in one of two ways (`rank`):
  - `plan_mean` (the default): a task's runs are grouped by their plan's signature (each
    step's agent and which earlier steps it sees; the subtasks' wording is not part of it), and
    each plan is scored by its mean reward over all its counted runs, right and wrong alike;
    plans rank by that mean, then by how many runs it rests on, then by their mean cost, and
    the warm-up trains on the best run (below) of each of the best `per_task` plans that have
    a run it may train on (a conductor-written one passing `correct_only` and `min_reward`).
    With `more_steps_margin` m > 0 a plan of more steps is taken over the best plan of fewer
    steps only if its mean is higher by more than m (`fewer_steps_first`): a second step
    that adds nothing is a near tie the best of many noisy means wins by luck.
    With `ties_within_se` z > 0 two plans whose means differ by at most z standard errors of
    the difference are a tie, and the cheaper ranks first (`cheaper_when_tied`).
    With a handful of runs per task the best single run is mostly luck: a cheap one-step plan
    that was right once beats a review plan that is right nine times in ten. The mean over
    all of a plan's runs is the estimate of its expected reward that a run's own reward is not.
    With `plan_means_by` "tag" the plans of a task are ordered by their mean over the runs of
    every training task sharing its first tag (`by_kind_order`): the tasks of one kind learn
    one plan, and a plan the kind ranks first is rehearsed, and learned, on a task whose one
    run of it drew a wrong answer (`rehearsed_run`) or whose conductor never wrote it: the
    rehearsal runs a sibling task's text of it there, and the task learns that text under its
    own prompt, credited with its own runs of it (`borrowed_plans`, `borrowed_run`).
    Rehearsal (`rehearse`, run by the training workflow before the warm-up) executes each
    task's best candidate plans again as fixed plans; their runs count towards their plan's
    mean (they are recorded under the policy `baseline` in the run's rehearsal batch, and
    counted whoever `conductors` names), never trained on themselves: they carry no
    conductor tokens.
  - `run`: the runs themselves, reward descending, then the run's cost ascending (of two
    plans that scored alike the cheaper is learned), then the earlier run.

The loss is the cross-entropy of each selected plan's tokens under the policy, over the tokens
the plan grammar did not force (the forced ones have probability 1 and no gradient, as in GRPO;
samples are built as the trainer builds rollouts, trainer/rollouts.py `attempt_sample`, and a
plan a server sampled, or one written under a forced shape, has the plain grammar's records
reconstructed first, trainer/reconstruct.py: a forced shape's deciding tokens are learned),
averaged over
the tokens of an optimiser step:

    L = - sum_i w_i sum_t m_it log pi(o_it | q_i, o_i<t) / sum_i sum_t m_it

with w_i = 1 (rejection sampling) or the run's reward (`reward_weighted`). It is GRPO's own
`train_step` on these samples with advantage w_i and no behaviour log-probs: its first step is
on-policy, so the ratio is 1 and its gradient is exactly w_i * grad log pi, the gradient of L; one
call per optimiser step, so no clipping ever applies. A plan an API conductor wrote carries no
token ids: its text is tokenized again and every token trains (nothing records what a grammar
forced), its prompt as the trace recorded it.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from conductor_engine.engine.contracts.plan_shapes import Outcome, shape_label
from conductor_engine.engine.contracts.plans import Plan
from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.contracts.traces import StoredRun, Trace
from conductor_engine.engine.contracts.training import (
    LossConfig,
    Recipe,
    StepMetrics,
    WarmupConfig,
)
from conductor_engine.engine.rewards.rollouts import as_rollout, count_reasons
from conductor_engine.trainer.grpo import Sample
from conductor_engine.trainer.plan_means import Signature, plan_signature
from conductor_engine.trainer.rollouts import attempt_sample, deciding_attempts


@dataclass
class Selection:
    """The plans the warm-up trains on (one trace per selected run, best first per task), and
    the candidate runs it did not take, by reason."""

    plans: list[Trace] = field(default_factory=list)
    left_out: dict[str, int] = field(default_factory=dict)
    ranked_plans: int = 0
    counted_runs: int = 0
    plan_means: dict[tuple[str, str], float] = field(default_factory=dict)
    """Rank plan_mean: the mean reward of each selected run's plan, by (workflow id, run id)."""

    @property
    def tasks(self) -> int:
        return len({t.task.id for t in self.plans})

    def conductors(self) -> dict[str, int]:
        return dict(Counter(t.policy.name for t in self.plans).most_common())

    def mean_reward(self) -> float | None:
        rewards = [reward_of(t) for t in self.plans]
        return sum(rewards) / len(rewards) if rewards else None

    def mean_plan_reward(self) -> float | None:
        means = [self.plan_means[k] for t in self.plans
                 if (k := (t.workflow_id, t.run_id)) in self.plan_means]
        return sum(means) / len(means) if means else None

    def shapes(self) -> dict[str, int]:
        return dict(Counter(signature_shape(plan_signature(t)) for t in self.plans
                            ).most_common())


def reward_of(trace: Trace) -> float:
    return trace.reward.value if trace.reward and trace.reward.value is not None else 0.0


def rank_key(trace: Trace) -> tuple[float, float, str, Any, str]:
    """Best first: the higher reward, then the cheaper run, then the conductor's text that
    sorts first, then the earlier run. The text comes before the time: equal runs of a plan
    differ in the wording of their subtasks and finish in whatever order concurrent runs
    finish, so ranked by time the same seeds trained different words (routing seed 29's two
    warm-ups, docs/results/learning.md); ranked by text they train the same."""
    written = "\x1f".join(a.raw_text for a in deciding_attempts(trace))
    return (-reward_of(trace), trace.totals.cost_usd, written, trace.finished_at,
            trace.workflow_id)


def why_not_counted(trace: Trace, task_ids: frozenset[str], cfg: WarmupConfig,
                    rehearsal_batch: str | None = None) -> str | None:
    """Why this stored run says nothing about its plan's reward on a training task, or None
    when it counts (a run of this training run's rehearsal counts whoever `conductors` names)."""
    if trace.depth != 0 or trace.task.id not in task_ids:
        return "not_a_training_task"
    rehearsed = rehearsal_batch is not None and trace.task.batch == rehearsal_batch
    if cfg.conductors is not None and not rehearsed and trace.policy.name not in cfg.conductors:
        return "other_conductor"
    honest = as_rollout(trace)
    if not isinstance(honest, Trace):
        return honest  # failed, untrusted, verifier error, no reward, plan retried ...
    if honest.status != "completed":
        return "invalid_plan"  # a run that became its invalid first attempt included
    return None


def why_not(trace: Trace, task_ids: frozenset[str], cfg: WarmupConfig) -> str | None:
    """Why this stored run is not a plan to learn from, or None when it is one."""
    return why_not_counted(trace, task_ids, cfg) or why_not_trained(trace, cfg)


def why_not_trained(trace: Trace, cfg: WarmupConfig) -> str | None:
    """Why a counted run is not one to train on (a wrong answer, too low a reward, no
    conductor prompt: a fixed plan's; with `dead_steps` "skip", a plan with a step whose output
    cannot reach the answer), or None."""
    verdict = trace.reward.verdict if trace.reward else None
    if cfg.correct_only and not (verdict is not None and verdict.correct):
        return "not_correct"
    if reward_of(trace) < cfg.min_reward:
        return "below_min_reward"
    if not any(a.prompt for a in deciding_attempts(trace)):
        return "no_prompt"
    if cfg.dead_steps == "skip" and has_dead_steps(trace):
        return "dead_step"
    return None


def has_dead_steps(trace: Trace) -> bool:
    """Whether a plan of the run has a step whose output cannot reach the answer
    (Plan.dead_steps: a draft its last step never sees).

    Why the warm-up skips such a plan: it answers as the plan without that step does, and pays
    for the step, so it is never better; but its mean is measured on other draws than the
    plain plan's and, after rounds of sampling, often rests on more runs, so it can rank first
    while the plain plan was never rehearsed. The five-agent hand-written pool learned "wren,
    then heron apart" for sports in rounds 1 to 3 that way, with heron alone written twice and
    never rehearsed (docs/results/learning.md). Skipped, the run still counts towards its
    plan's mean; the plan is neither learned nor rehearsed, so the rehearsal's places go to
    plans whose every step can matter."""
    return any(r.plan.dead_steps() for r in trace.rounds if r.plan is not None)


def signature_shape(signature: Signature) -> str:
    """The shape of a signature's plans as people name it ("2 steps (sees)"), rounds joined
    by " then "."""
    labels = []
    for steps in signature:
        outcomes: list[Outcome] = []
        for _, sees in steps[1:]:
            outcomes += ["more", "sees" if sees else "apart"]
        labels.append(shape_label((*outcomes, "end")))
    return " then ".join(labels) or "no plan"


@dataclass
class RankedPlan:
    """One plan of one task: its counted runs, their mean reward and cost, and the run the
    warm-up would train on (the best by `rank_key` it may train on), if any."""

    task_id: str
    signature: Signature
    runs: list[Trace] = field(default_factory=list)
    best: Trace | None = None
    written: list[Trace] = field(default_factory=list)
    """With `plan_means_by` "tag": its conductor-written runs with a prompt, right or wrong
    (`by_kind_order`'s candidates and fallback)."""

    @property
    def mean_reward(self) -> float:
        return sum(reward_of(t) for t in self.runs) / len(self.runs)

    @property
    def mean_cost(self) -> float:
        return sum(t.totals.cost_usd for t in self.runs) / len(self.runs)

    @property
    def steps(self) -> int:
        """The plan's steps, over all its rounds."""
        return sum(len(steps) for steps in self.signature)

    @property
    def standard_error(self) -> float:
        """Of its mean reward: its runs' standard deviation over the root of their number; with
        one run 0.5, the largest a reward in [0, 1] can have (one run says nothing of it)."""
        rewards = [reward_of(t) for t in self.runs]
        return statistics.stdev(rewards) / math.sqrt(len(rewards)) if len(rewards) > 1 else 0.5

    def key(self) -> tuple[float, int, float, str]:
        """Best first: the higher mean reward, then more runs, then cheaper, then a stable
        order (the signature's text)."""
        return (-self.mean_reward, -len(self.runs), self.mean_cost, repr(self.signature))


def rank_plans(traces: Iterable[Trace], task_ids: Iterable[str], cfg: WarmupConfig,
               rehearsal_batch: str | None = None
               ) -> tuple[dict[str, list[RankedPlan]], list[str]]:
    """Each training task's plans among `traces`, best first (RankedPlan.key), and why each
    run that does not count was left out."""
    allowed = frozenset(task_ids)
    any_verdict = revised(cfg, correct_only=False)
    plans: dict[tuple[str, Signature], RankedPlan] = {}
    reasons: list[str] = []
    for trace in traces:
        reason = why_not_counted(trace, allowed, cfg, rehearsal_batch)
        if reason is not None:
            reasons.append(reason)
            continue
        sig = plan_signature(trace)
        plan = plans.setdefault((trace.task.id, sig), RankedPlan(trace.task.id, sig))
        plan.runs.append(trace)
        if why_not_trained(trace, cfg) is None and (
                plan.best is None or rank_key(trace) < rank_key(plan.best)):
            plan.best = trace
        if cfg.plan_means_by == "tag" and why_not_trained(trace, any_verdict) is None:
            plan.written.append(trace)
    by_task: dict[str, list[RankedPlan]] = {}
    for plan in plans.values():
        if plan.best is None and rehearsal_batch is not None:
            plan.best = rehearsed_run(plan, rehearsal_batch)
        by_task.setdefault(plan.task_id, []).append(plan)
    return {t: sorted(by_task[t], key=RankedPlan.key) for t in sorted(by_task)}, reasons


def rehearsed_run(plan: RankedPlan, rehearsal_batch: str) -> Trace | None:
    """With `plan_means_by` "tag", a plan no right run of which a conductor wrote: the best of
    its conductor-written runs (`rank_key`) whose exact plan, subtasks' wording and all, this
    training run's rehearsal ran (`candidate_plans` offers such plans), or None. Its mean
    then rests on the rehearsal's runs of that very text, so the run's own wrong draw says
    nothing against learning it: a task whose one run of its kind's best plan drew a wrong
    answer would otherwise never learn that plan (structured pool 3's split-7,
    docs/results/learning.md)."""
    texts = {t.rounds[0].plan.model_dump_json() for t in plan.runs
             if t.task.batch == rehearsal_batch and len(t.rounds) == 1
             and t.rounds[0].plan is not None}
    return min((t for t in plan.written if len(t.rounds) == 1 and t.rounds[0].plan is not None
                and t.rounds[0].plan.model_dump_json() in texts), key=rank_key, default=None)


def fewer_steps_first(plans: Sequence[RankedPlan], margin: float) -> list[RankedPlan]:
    """`plans` (one task's, best first by RankedPlan.key) reordered so that a plan of more
    steps comes before the best plan of fewer steps only if its mean reward is higher by more
    than `margin` (`more_steps_margin`); 0 leaves the order as it is.

    Why: a second step that adds nothing (an agent whose answer alone is right, drafted for by
    another) is worth the plain plan's reward less a little cost, so the two are near tied;
    after rounds of sampling and rehearsal a one-step task has many such plans, and the best
    of their noisy means beats the plain plan's by luck about as often as not (the tabular
    bench, tests/benchmarks/bench_shape_credit.py `--warmup-tie`). A second step that matters
    is worth far more than the margin. Each place is filled in turn: among the plans left, the
    best of the fewest steps, replaced by the best of each larger step count in turn that beats
    the one standing by more than `margin`."""
    if margin <= 0:
        return list(plans)
    left, out = list(plans), []
    while left:
        best_of: dict[int, RankedPlan] = {}
        for plan in left:  # best first, so the first of each step count is its best
            best_of.setdefault(plan.steps, plan)
        standing: RankedPlan | None = None
        for steps in sorted(best_of):
            plan = best_of[steps]
            if standing is None or plan.mean_reward > standing.mean_reward + margin:
                standing = plan
        assert standing is not None
        out.append(standing)
        left.remove(standing)
    return out


def cheaper_when_tied(plans: Sequence[RankedPlan], ties: float) -> list[RankedPlan]:
    """`plans` (best first by RankedPlan.key) reordered so that each place goes to the cheapest
    of the plans left whose mean reward is within `ties` standard errors of their difference
    of the best mean left (`ties_within_se`; then RankedPlan.key); 0 leaves the order as it is.

    Why: after rounds of sampling and rehearsal a kind has many plans near its best, and which
    of them has the best mean is luck; the reward's cost penalty is too small to break such a
    tie, though one plan may cost ten times another. Structured pool 1's review kind after the
    fourth warm-up round: a draft by the costly generalist, 0.823 over 29 runs at $0.025,
    against the cheap specialist's, 0.820 over 75 at $0.002 (each mean's error about 0.036);
    the first was learned, and the held-out tasks paid 0.22x MoA's tokens where the second's paid
    0.18x (docs/results/learning.md)."""
    if ties <= 0:
        return list(plans)
    left, out = list(plans), []
    while left:
        top = left[0]
        tied = [p for p in left if top.mean_reward - p.mean_reward
                <= ties * math.hypot(top.standard_error, p.standard_error)]
        pick = min(tied, key=lambda p: (p.mean_cost, p.key()))
        out.append(pick)
        left.remove(pick)
    return out


def in_order(plans: Iterable[RankedPlan], margin: float, ties: float) -> list[RankedPlan]:
    """`plans` best first: RankedPlan.key, the cheaper of near ties first by `ties`
    (`cheaper_when_tied`), then fewer steps first by `margin` (`fewer_steps_first`)."""
    return fewer_steps_first(cheaper_when_tied(sorted(plans, key=RankedPlan.key), ties), margin)


def kind_of(trace: Trace) -> str:
    """The kind a task's runs are pooled with under `plan_means_by` "tag": its first tag, ""
    when it has none (as the held-out split groups tasks, engine/contracts/training.py
    `split_heldout`)."""
    return trace.task.tags[0] if trace.task.tags else ""


def pooled_by_kind(ranked: dict[str, list[RankedPlan]], margin: float, ties: float = 0.0
                   ) -> dict[str, list[RankedPlan]]:
    """Each kind's plans (`RankedPlan.task_id` the kind's tag), every plan's runs and
    conductor-written runs on all the kind's training tasks pooled, in the kind's order
    (`in_order` on the pooled runs)."""
    pooled: dict[tuple[str, Signature], RankedPlan] = {}
    for plans in ranked.values():
        for p in plans:
            kind = kind_of(p.runs[0])
            into = pooled.setdefault((kind, p.signature), RankedPlan(kind, p.signature))
            into.runs.extend(p.runs)
            into.written.extend(p.written)
    by_kind: dict[str, list[RankedPlan]] = {}
    for plan in pooled.values():
        by_kind.setdefault(plan.task_id, []).append(plan)
    return {kind: in_order(plans, margin, ties) for kind, plans in by_kind.items()}


def by_kind_order(ranked: dict[str, list[RankedPlan]], margin: float, ties: float = 0.0
                  ) -> dict[str, list[RankedPlan]]:
    """Each task's plans (`rank_plans`' lists) in the order its kind ranks them
    (`pooled_by_kind`).

    Why: after rounds of sampling and rehearsal a task has many plans near its best, each
    measured by a handful of runs, and which of them its own mean puts first is mostly luck.
    The tasks of one kind (in the sim, one tag: the same agents are good at all of them) then
    learn different near-tied plans, and a held-out task of the kind writes whichever its
    question resembles (structured pool 3: split tasks learned three first agents, and both
    held-out splits drafted with the one a single training task had learned,
    docs/results/learning.md). Pooled over the kind, a plan's mean rests on about six times
    the runs, and every task of the kind learns the same plan (`borrowed_run` where its own
    conductor never wrote it)."""
    place = {(kind, p.signature): i
             for kind, plans in pooled_by_kind(ranked, margin, ties).items()
             for i, p in enumerate(plans)}
    return {task: sorted(plans, key=lambda p: place[kind_of(p.runs[0]), p.signature])
            for task, plans in ranked.items()}


def kind_firsts(ranked: dict[str, list[RankedPlan]], margin: float) -> dict[str, RankedPlan]:
    """Each kind's first plan (`pooled_by_kind`) among those a conductor wrote, in one round:
    the plan every task of the kind should learn."""
    return {kind: first for kind, plans in pooled_by_kind(ranked, margin).items()
            if (first := next((p for p in plans if p.written and len(p.signature) == 1),
                              None)) is not None}


def borrowed_plans(ranked: dict[str, list[RankedPlan]]) -> dict[str, Plan]:
    """With `plan_means_by` "tag", each training task that has no run at all of its kind's
    first plan (`kind_firsts`, by the candidates' order): that plan as the best of its
    conductor-written runs on a sibling task (`rank_key`) wrote it, subtasks and all, for the
    rehearsal to run on this task. Its runs there then count towards the plan's mean on the
    task, and the warm-up can teach it with this task's own prompt (`borrowed_run`).

    Why: a task whose conductor never wrote its kind's plan used to learn its own next plan
    (structured pool 1: a review task learned a worse plan that a held-out task then wrote,
    docs/results/learning.md); leaving such a task out instead taught each kind from one or
    two of its six tasks, which did not reach the held-out tasks."""
    firsts = kind_firsts(ranked, margin=0.0)
    out: dict[str, Plan] = {}
    for task, plans in ranked.items():
        first = firsts.get(kind_of(plans[0].runs[0])) if plans else None
        if first is None or any(p.signature == first.signature for p in plans):
            continue
        source = min(first.written, key=rank_key)
        if source.rounds[0].plan is not None:
            out[task] = source.rounds[0].plan
    return out


def borrowed_run(plan: RankedPlan, kind: RankedPlan, own: Sequence[Trace],
                 rehearsal_batch: str) -> Trace | None:
    """A run to learn `plan` (one task's, its kind's first) from when no conductor wrote it on
    this task: the best of the task's rehearsed runs of a text a conductor wrote on a sibling
    task (`kind.written`, the kind's pooled plan), with that conductor's plan attempt under
    this task's own prompt (from `own`, the task's best conductor-written run). The sample is
    what the task's prompt would have asked for; the reward it carries is this task's, for
    that very plan text, executed and scored. None when the rehearsal has not run it here."""
    rehearsed: dict[str, Trace] = {}  # each text's best run on this task
    for t in sorted(plan.runs, key=rank_key):
        if t.task.batch == rehearsal_batch and len(t.rounds) == 1 and t.rounds[0].plan:
            rehearsed.setdefault(t.rounds[0].plan.model_dump_json(), t)
    sources = [t for t in sorted(kind.written, key=rank_key) if len(t.rounds) == 1
               and t.rounds[0].plan is not None
               and t.rounds[0].plan.model_dump_json() in rehearsed]
    prompts = [a.prompt for t in sorted(own, key=rank_key) for a in deciding_attempts(t)
               if a.prompt and len(t.rounds) == 1]
    if not sources or not prompts or not deciding_attempts(sources[0]):
        return None
    source = sources[0]
    assert source.rounds[0].plan is not None
    run = rehearsed[source.rounds[0].plan.model_dump_json()]
    attempt = revised(deciding_attempts(source)[0], prompt=prompts[0])
    return revised(run, policy=source.policy,
                   rounds=[revised(run.rounds[0], attempts=[attempt])])


def candidate_plans(traces: Iterable[Trace], task_ids: Iterable[str], cfg: WarmupConfig,
                    rehearsal_batch: str | None = None) -> dict[str, list[Plan]]:
    """Each training task's `cfg.rehearse_plans` best plans the warm-up could train on, as
    the plan of each one's best run (its subtasks as its conductor wrote them): what the
    rehearsal runs again. Only one-round plans: a fixed plan is one round. A plan this
    training run has rehearsed already (an earlier warm-up round's) is not a candidate: its
    mean rests on its rehearsals, and the round's runs go to plans it has not measured.
    Ranked by mean alone, not `more_steps_margin`: a rehearsal gathers the runs a longer plan
    needs to earn its margin, so it tries the plans that look best; with `plan_means_by`
    "tag", the plans its kind's pooled runs rank first (`by_kind_order`), a plan the task's
    conductor wrote but never answered right with included (`rehearsed_run`)."""
    ranked, _ = rank_plans(traces, task_ids, cfg, rehearsal_batch)
    borrowed: dict[str, Plan] = {}
    if cfg.plan_means_by == "tag":
        borrowed = borrowed_plans(ranked)
        ranked = by_kind_order(ranked, margin=0.0)
    out: dict[str, list[Plan]] = {}
    for task, plans in ranked.items():
        own = [plan for p in plans if (run := _source(p)) is not None
               and len(p.signature) == 1
               and not (rehearsal_batch and any(t.task.batch == rehearsal_batch
                                                for t in p.runs))
               and (plan := run.rounds[0].plan) is not None]
        chosen = [*([borrowed[task]] if task in borrowed else []), *own][: cfg.rehearse_plans]
        if chosen:
            out[task] = chosen
    return out


def _source(plan: RankedPlan) -> Trace | None:
    """The run whose plan a rehearsal runs again: the one the warm-up would train on, or with
    `plan_means_by` "tag" (`written` filled) the best conductor-written one, right or wrong:
    a plan its kind ranks first is rehearsed on a task whose one run of it drew wrong."""
    return plan.best or min(plan.written, key=rank_key, default=None)


def select_plans(traces: Iterable[Trace], task_ids: Iterable[str], cfg: WarmupConfig,
                 rehearsal_batch: str | None = None) -> Selection:
    """What the warm-up trains on among `traces` (see the module docstring): per training
    task the best run of each of its `cfg.per_task` best plans (rank plan_mean), or its best
    `cfg.per_task` runs (rank run); best first per task, tasks in id order."""
    if cfg.rank == "plan_mean":
        return _by_plan(traces, task_ids, cfg, rehearsal_batch)
    allowed = frozenset(task_ids)
    by_task: dict[str, list[Trace]] = {}
    reasons: list[str] = []
    for trace in traces:
        reason = why_not(trace, allowed, cfg)
        if reason is None:
            by_task.setdefault(trace.task.id, []).append(trace)
        else:
            reasons.append(reason)
    plans = [t for task in sorted(by_task)
             for t in sorted(by_task[task], key=rank_key)[: cfg.per_task]]
    return Selection(plans=plans, left_out=count_reasons(reasons))


def _by_plan(traces: Iterable[Trace], task_ids: Iterable[str], cfg: WarmupConfig,
             rehearsal_batch: str | None) -> Selection:
    """select_plans ranked by plan: the best run of each of a task's best `per_task` plans
    that have a run to train on (`in_order`: the cheaper of near ties by `ties_within_se`,
    fewer steps first by `more_steps_margin`); with
    `plan_means_by` "tag", in the order of its kind's pooled runs (`by_kind_order`)."""
    ranked, reasons = rank_plans(traces, task_ids, cfg, rehearsal_batch)
    if cfg.plan_means_by == "tag":
        ordered = by_kind_order(ranked, cfg.more_steps_margin, cfg.ties_within_se)
        if rehearsal_batch is not None:
            _borrow(ordered, rehearsal_batch)
        chosen = [p for plans in ordered.values()
                  for p in [p for p in plans if p.best is not None][: cfg.per_task]]
    else:
        chosen = [p for plans in ranked.values()
                  for p in in_order([p for p in plans if p.best is not None],
                                    cfg.more_steps_margin, cfg.ties_within_se)[: cfg.per_task]]
    return Selection(
        plans=[p.best for p in chosen if p.best is not None],
        left_out=count_reasons(reasons),
        ranked_plans=sum(len(p) for p in ranked.values()),
        counted_runs=sum(len(p.runs) for plans in ranked.values() for p in plans),
        plan_means={(p.best.workflow_id, p.best.run_id): p.mean_reward for p in chosen
                    if p.best is not None})


def _borrow(ordered: dict[str, list[RankedPlan]], rehearsal_batch: str) -> None:
    """Fill in `best` (`borrowed_run`) of each task's plan that no conductor wrote on the
    task, only the rehearsal ran there (`borrowed_plans` offered it in an earlier round)."""
    kinds = {kind: {p.signature: p for p in plans}
             for kind, plans in pooled_by_kind(ordered, 0.0).items()}
    for plans in ordered.values():
        own = [t for p in plans for t in p.written]
        for p in plans:
            if p.best is None and not p.written:
                p.best = borrowed_run(p, kinds[kind_of(p.runs[0])][p.signature], own,
                                      rehearsal_batch)


def stored_traces(runs: Sequence[StoredRun]) -> tuple[list[Trace], dict[str, int]]:
    """The traces of stored runs; those that could not be read, counted as "unreadable"."""
    traces = [r.trace for r in runs if r.trace is not None]
    unreadable = len(runs) - len(traces)
    return traces, ({"unreadable": unreadable} if unreadable else {})


def warmup_samples(plans: Sequence[Trace], tokenizer: Any, cfg: WarmupConfig
                   ) -> list[Sample]:
    """One sample per deciding plan attempt of each selected run, weighted 1 or by its reward
    (`reward_weighted`), without behaviour log-probs (each optimiser step is on-policy). A
    served plan's grammar records, and a forced shape's, must already be reconstructed
    (trainer/reconstruct.py, `unshape`)."""
    out: list[Sample] = []
    for trace in plans:
        weight = reward_of(trace) if cfg.reward_weighted else 1.0
        for attempt in deciding_attempts(trace):
            sample = attempt_sample(attempt, tokenizer, weight, behaviour_logprobs=False)
            if sample is not None:
                out.append(decisions_only(sample) if cfg.learn == "decisions" else sample)
    return out


def decisions_only(sample: Sample) -> Sample:
    """The sample with every token but its choices (`learn = "decisions"`) out of the loss,
    read as context as forced tokens are; unchanged when it records no choice."""
    if not sample.choices:
        return sample
    sample.forced = [k not in sample.choices for k in range(len(sample.completion_ids))]
    return sample


def sft_loss_config(recipe: Recipe) -> LossConfig:
    """GRPO's loss settings turned into the warm-up's: token-mean aggregation (dapo), the
    warm-up's learning rate, one optimiser step per call, no KL; the recipe's temperature,
    gradient clip and micro-batch size (how the policy is scored and fits memory)."""
    return LossConfig(loss_type="dapo", learning_rate=recipe.warmup.learning_rate,
                      max_grad_norm=recipe.loss.max_grad_norm, beta=0.0, steps_per_update=1,
                      micro_batch_size=recipe.loss.micro_batch_size,
                      temperature=recipe.loss.temperature)


def mean_logprob(model: Any, samples: Sequence[Sample], cfg: LossConfig, pad_id: int) -> float:
    """The mean log-prob per trained token (the grammar's forced ones left out) of `samples`
    under `model`, as the trainer scores tokens: the negative of the warm-up's loss."""
    import torch

    from conductor_engine.trainer.grpo import collate, per_token_logprobs

    device = next(model.parameters()).device
    total, tokens = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for i in range(0, len(samples), cfg.micro_batch_size):
            batch = collate(samples[i : i + cfg.micro_batch_size], pad_id).to(device)
            logps = per_token_logprobs(model, batch, temperature=cfg.temperature)
            total += float(logps.sum())
            tokens += int(batch.loss_mask.sum())
    model.train(was_training)
    return total / max(tokens, 1)


@dataclass
class FineTuned:
    """What the warm-up's steps did."""

    step: StepMetrics
    logprob_before: float
    logprob_after: float


def fine_tune(model: Any, optimizer: Any, samples: Sequence[Sample], recipe: Recipe, *,
              pad_id: int, seed: int = 0) -> FineTuned:
    """`recipe.warmup.epochs` passes over `samples`, `plans_per_step` samples an optimiser step
    (in a seeded order per epoch), each step one on-policy `train_step` (see the module
    docstring); the mean log-prob per trained token before and after."""
    from conductor_engine.trainer.grpo import train_step

    warm = recipe.warmup
    cfg = sft_loss_config(recipe)
    for group in optimizer.param_groups:
        group["lr"] = cfg.learning_rate
    before = mean_logprob(model, samples, cfg, pad_id)
    rng = random.Random(f"warmup\x1f{seed}")
    steps: list[StepMetrics] = []
    for _ in range(warm.epochs):
        order = list(samples)
        rng.shuffle(order)
        for i in range(0, len(order), warm.plans_per_step):
            steps.append(train_step(model, optimizer, order[i : i + warm.plans_per_step], cfg,
                                    pad_id=pad_id))
    after = mean_logprob(model, samples, cfg, pad_id)
    taken = [s for s in steps if s.steps]
    norms = [s.grad_norm for s in taken if math.isfinite(s.grad_norm)]
    step = StepMetrics(
        loss=-after, grad_norm=sum(norms) / len(norms) if norms else 0.0,
        tokens=sum(s.trained_tokens for s in samples), samples=len(samples),
        steps=sum(s.steps for s in steps), seconds=sum(s.seconds for s in steps),
        sample_tokens=sum(s.sample_tokens for s in steps),
        passed_tokens=sum(s.passed_tokens for s in steps),
        skipped=next((s.skipped for s in steps if s.skipped), None) if not taken else None,
    )
    return FineTuned(step=step, logprob_before=before, logprob_after=after)
