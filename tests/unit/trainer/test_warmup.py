"""The warm-up on scored plans (trainer/warmup.py): which stored runs it learns from, and that its
supervised steps make the selected plans more likely under a real (tiny) policy."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from conductor_engine.engine.contracts.agent_calls import Message
from conductor_engine.engine.contracts.names import BASELINE_POLICY
from conductor_engine.engine.contracts.plans import Access, Plan, Step
from conductor_engine.engine.contracts.rewards import Verdict
from conductor_engine.engine.contracts.strict import revised
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
    chosen = select_plans(runs.values(), ["a", "b"], WarmupConfig(rank="run", per_task=1))
    assert [t.workflow_id for t in chosen.plans] == [runs["a-best"].workflow_id,
                                                     runs["b-cheap"].workflow_id]
    two = select_plans(runs.values(), ["a", "b"], WarmupConfig(rank="run", per_task=2))
    assert [t.workflow_id for t in two.plans] == [
        runs[k].workflow_id for k in ("a-best", "a-same-dearer", "b-cheap", "b-same-later")]
    assert two.conductors() == {"teacher": 4} and two.tasks == 2


def test_equal_runs_of_a_task_train_the_same_words_whichever_finished_first() -> None:
    """Equal reward and cost: the conductor's text decides, not the finishing order of
    concurrent runs, so the same seeds train the same words."""
    from conductor_engine.trainer.warmup import select_plans

    chosen = []
    for first, second in (("tuna", "babe"), ("babe", "tuna")):
        runs = [scored("a", 1.0, minute=0), scored("a", 1.0, minute=1)]
        for run, subtask in zip(runs, (first, second), strict=True):
            run.rounds[0].attempts[-1].raw_text = f'model_id = ["x"]\nsubtasks = ["{subtask}"]'
        picked = select_plans(runs, ["a"], WarmupConfig(rank="run", per_task=1)).plans
        chosen.append(picked[0].rounds[0].attempts[-1].raw_text)
    assert chosen == ['model_id = ["x"]\nsubtasks = ["babe"]'] * 2


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
    chosen = select_plans(traces, ["a", "b", "d"], WarmupConfig(rank="run",
                                                                 conductors=["teacher"]))
    assert [t.workflow_id for t in chosen.plans] == [honest.workflow_id]
    assert chosen.left_out == {"not_a_training_task": 2, "not_correct": 1,
                               "other_conductor": 1, "run_failed": 1, "untrusted": 1}
    # wrong answers may be learned when asked for, above a reward floor
    loose = select_plans(traces, ["b"], WarmupConfig(rank="run", correct_only=False,
                                                     min_reward=0.2))
    assert [t.workflow_id for t in loose.plans] == [wrong.workflow_id]
    assert select_plans(traces, ["b"], WarmupConfig(rank="run", correct_only=False,
                                                    min_reward=0.3)).plans == []


SOLO: tuple[tuple[str, Access], ...] = (("cheap", []),)
REVIEW: tuple[tuple[str, Access], ...] = (("drafter", []), ("reviewer", "all"))


def planned(task_id: str, steps: tuple[tuple[str, Access], ...], reward: float, *,
            cost: float = 0.01, minute: int = 0, wording: str = "Do it.",
            conductor: str = "teacher", fixed_in: str | None = None) -> Trace:
    """A scored run of `task_id` whose plan has these (agent, access) steps, the subtasks
    worded `wording`; `fixed_in`: a fixed-plan run (no conductor, no prompt) of that batch,
    as a rehearsal records it."""
    trace = scored(task_id, reward, cost=cost, minute=minute, conductor=conductor)
    trace.rounds[0].plan = Plan(steps=[Step(agent=a, subtask=f"{wording} ({i})", access=acc)
                                       for i, (a, acc) in enumerate(steps)])
    if fixed_in is not None:
        trace.policy = PolicyRef(name=BASELINE_POLICY, version="base")
        trace.task.batch = fixed_in
        trace.rounds[0].attempts[0].prompt = []
    return trace


def test_a_plan_right_in_most_of_its_runs_outranks_a_cheaper_plan_that_was_right_once() -> None:
    """Four runs of each plan of task a: the cheap one-step plan was right once (the cheapest
    right run of all: what ranking runs learns), the review plan three times. Ranked by plan
    mean the review plan wins, and its cheapest right run is trained on."""
    from conductor_engine.trainer.warmup import select_plans

    lucky = planned("a", SOLO, 1.0, cost=0.001)
    solo_wrong = [_wrong(planned("a", SOLO, 0.5, cost=0.001, minute=i)) for i in range(1, 4)]
    review = [planned("a", REVIEW, 1.0, cost=0.02 + i / 100, minute=i) for i in range(3)]
    review_wrong = _wrong(planned("a", REVIEW, 0.5, cost=0.01))
    runs = [lucky, *solo_wrong, *review, review_wrong]
    by_run = select_plans(runs, ["a"], WarmupConfig(rank="run"))
    assert [t.workflow_id for t in by_run.plans] == [lucky.workflow_id]
    by_plan = select_plans(runs, ["a"], WarmupConfig())
    assert [t.workflow_id for t in by_plan.plans] == [review[0].workflow_id]
    assert (by_plan.ranked_plans, by_plan.counted_runs) == (2, 8)
    assert by_plan.mean_plan_reward() == 0.875 and by_plan.shapes() == {"2 steps (sees)": 1}
    assert by_plan.left_out == {}
    # both plans, best first, when two are asked for
    two = select_plans(runs, ["a"], WarmupConfig(per_task=2))
    assert [t.workflow_id for t in two.plans] == [review[0].workflow_id, lucky.workflow_id]


def test_a_longer_plan_must_beat_the_best_shorter_plan_by_the_margin_to_be_learned() -> None:
    """Task a: the cheap agent alone, right 9 times in 10, and a plan that drafts with another
    agent and has the cheap agent answer, right 10 times in 10 (its second step adds nothing
    but luck): ranked by mean the two-step plan wins; with a margin of 0.1 the one-step plan
    does. Task b: a review plan right 9 times in 10 against the cheap agent alone right 5
    times: it beats the margin and is learned either way. per_task 2 keeps both, shorter
    first."""
    from conductor_engine.trainer.warmup import select_plans

    relay: tuple[tuple[str, Access], ...] = (("drafter", []), ("cheap", "all"))
    solo = [planned("a", SOLO, 1.0, cost=0.001, minute=i) for i in range(9)]
    solo.append(_wrong(planned("a", SOLO, 0.25, cost=0.001, minute=9)))
    twice = [planned("a", relay, 1.0, cost=0.002, minute=i) for i in range(10)]
    review = [planned("b", REVIEW, 1.0, cost=0.002, minute=i) for i in range(9)]
    review.append(_wrong(planned("b", REVIEW, 0.25, cost=0.002, minute=9)))
    alone = [planned("b", SOLO, 1.0 if i % 2 else 0.25, cost=0.001, minute=i) for i in range(10)]
    for t in alone[::2]:
        _wrong(t)
    runs = [*solo, *twice, *review, *alone]
    by_mean = select_plans(runs, ["a", "b"], WarmupConfig())
    assert by_mean.shapes() == {"2 steps (sees)": 2}
    fewer = select_plans(runs, ["a", "b"], WarmupConfig(more_steps_margin=0.1))
    assert [t.task.id for t in fewer.plans] == ["a", "b"]
    assert fewer.plans[0].workflow_id == solo[0].workflow_id
    assert fewer.plans[1].workflow_id == review[0].workflow_id
    both = select_plans(runs, ["a"], WarmupConfig(more_steps_margin=0.1, per_task=2))
    assert [t.workflow_id for t in both.plans] == [solo[0].workflow_id, twice[0].workflow_id]


def _wrong(trace: Trace) -> Trace:
    assert trace.reward is not None and trace.reward.verdict is not None
    trace.reward.verdict.correct = False
    return trace


def test_a_plan_is_its_agents_and_what_each_step_sees_never_its_subtasks_wording() -> None:
    """Runs of one plan worded three ways are one plan; the same agents with the reviewer
    blind to the draft are another ("all" and [0] are the same access for step 2); at equal
    means the plan resting on more runs wins."""
    from conductor_engine.trainer.warmup import plan_signature, rank_plans, select_plans

    worded = [planned("a", REVIEW, 1.0, wording=w, minute=i)
              for i, w in enumerate(["Draft.", "Write a draft", "Check the draft"])]
    listed = planned("a", (("drafter", []), ("reviewer", [0])), 1.0, minute=3)
    blind = [planned("a", (("drafter", []), ("reviewer", [])), 1.0, cost=0.0, minute=4 + i)
             for i in range(2)]
    assert len({plan_signature(t) for t in [*worded, listed]}) == 1
    ranked, _ = rank_plans([*worded, listed, *blind], ["a"], WarmupConfig())
    assert [len(p.runs) for p in ranked["a"]] == [4, 2]
    chosen = select_plans([*worded, listed, *blind], ["a"], WarmupConfig())
    assert chosen.shapes() == {"2 steps (sees)": 1}


def test_held_out_tasks_other_conductors_and_unrehearsed_fixed_plans_never_count() -> None:
    """The review plan's mean counts only this run's evidence: a held-out run of the task,
    a run another conductor planned and a fixed-plan run outside this run's rehearsal batch
    are left out; the rehearsal's fixed-plan runs count (whoever `conductors` names) but are
    never trained on themselves."""
    from conductor_engine.trainer.warmup import candidate_plans, select_plans

    review = planned("a", REVIEW, 1.0, cost=0.05, wording="Review it.")
    lucky = planned("a", SOLO, 1.0, cost=0.001)
    rehearsed = [planned("a", SOLO, 0.5, fixed_in="rehearse-me", minute=i) for i in range(3)]
    rehearsed += [planned("a", REVIEW, 1.0, fixed_in="rehearse-me", minute=i) for i in range(3)]
    noise = [planned("heldout~a", SOLO, 1.0), planned("a", SOLO, 1.0, conductor="someone"),
             planned("a", SOLO, 1.0, fixed_in="rehearse-other"), planned("c", SOLO, 1.0)]
    cfg = WarmupConfig(conductors=["teacher"], rehearse=3, rehearse_plans=2)
    before = candidate_plans([review, lucky, *noise], ["a"], cfg, "rehearse-me")
    assert [[s.agent for s in p.steps] for p in before["a"]] == [["cheap"], ["drafter",
                                                                             "reviewer"]]
    assert before["a"][1].steps[0].subtask == "Review it. (0)"  # the conductor's own words
    chosen = select_plans([review, lucky, *rehearsed, *noise], ["a"], cfg, "rehearse-me")
    assert [t.workflow_id for t in chosen.plans] == [review.workflow_id]
    assert chosen.counted_runs == 8 and chosen.left_out == {"not_a_training_task": 2,
                                                            "other_conductor": 2}
    # without the rehearsal's batch its runs are another conductor's, and luck wins
    unrehearsed = select_plans([review, lucky, *rehearsed, *noise], ["a"], cfg)
    assert [t.workflow_id for t in unrehearsed.plans] == [lucky.workflow_id]
    # a plan only fixed-plan runs wrote is never trained on, however well it scored
    only_fixed = select_plans(rehearsed, ["a"], WarmupConfig(), "rehearse-me")
    assert only_fixed.plans == [] and only_fixed.counted_runs == 6


def test_a_later_rounds_candidates_are_the_best_plans_not_rehearsed_yet() -> None:
    """Once this run has rehearsed the review plan, the next round's candidates are the best
    plans it has not: the two-steps-apart plan a round's samples wrote, then the cheap one.
    Another run's rehearsal batch does not count as this run's."""
    from conductor_engine.trainer.warmup import candidate_plans

    apart: tuple[tuple[str, Access], ...] = (("drafter", []), ("reviewer", []))
    review = planned("a", REVIEW, 1.0, cost=0.05)
    rehearsed = [planned("a", REVIEW, 1.0, fixed_in="rehearse-me", minute=i) for i in range(3)]
    sampled = [planned("a", apart, 1.0, minute=4), planned("a", SOLO, 0.95, minute=5)]
    cfg = WarmupConfig(conductors=["teacher"], rehearse=3, rehearse_plans=2)
    got = candidate_plans([review, *rehearsed, *sampled], ["a"], cfg, "rehearse-me")
    assert [[(s.agent, s.access) for s in p.steps] for p in got["a"]] == [
        [("drafter", []), ("reviewer", [])], [("cheap", [])]]
    elsewhere = [planned("a", REVIEW, 1.0, fixed_in="rehearse-other", minute=i)
                 for i in range(3)]
    first = candidate_plans([review, *elsewhere, *sampled], ["a"], cfg, "rehearse-me")
    # another run's rehearsals are not counted: the review plan is a candidate again, after
    # the apart plan (the same mean on one run each; the cheaper first)
    assert [p.steps[1].access for p in first["a"]] == [[], "all"]


def tagged(trace: Trace, tag: str) -> Trace:
    trace.task.tags = [tag]
    return trace


def test_tasks_of_one_tag_learn_the_plan_their_pooled_runs_rank_first() -> None:
    """Tasks a, b, c share tag k. On a the cheap plan was lucky (right 3 of 3) and the review
    plan right 3 of 4; on b and c the review is right 4 of 4 and the cheap plan 1 of 4. Ranked
    per task, a learns the cheap plan; pooled over the tag the review plan (11 of 12 against
    5 of 11) comes first on every task. Task d, tagged otherwise, is not pooled with them and
    keeps its own best; the margin applies to the pooled means."""
    from conductor_engine.trainer.warmup import select_plans

    def runs(task: str, plan: tuple[tuple[str, Access], ...], right: int, n: int,
             tag: str = "k") -> list[Trace]:
        return [tagged(planned(task, plan, 1.0, minute=i) if i < right
                       else _wrong(planned(task, plan, 0.25, minute=i)), tag)
                for i in range(n)]

    traces = [*runs("a", SOLO, 3, 3), *runs("a", REVIEW, 3, 4),
              *[t for task in "bc" for t in [*runs(task, REVIEW, 4, 4), *runs(task, SOLO, 1, 4)]],
              *runs("d", SOLO, 3, 3, "other"), *runs("d", REVIEW, 3, 4, "other")]
    per_task = select_plans(traces, list("abcd"), WarmupConfig())
    assert [(t.task.id, len(t.rounds[0].plan.steps)) for t in per_task.plans  # type: ignore[union-attr]
            ] == [("a", 1), ("b", 2), ("c", 2), ("d", 1)]
    pooled = select_plans(traces, list("abcd"), WarmupConfig(plan_means_by="tag"))
    assert [(t.task.id, len(t.rounds[0].plan.steps)) for t in pooled.plans  # type: ignore[union-attr]
            ] == [("a", 2), ("b", 2), ("c", 2), ("d", 1)]
    # pooled 0.94 against 0.59: above a margin of 0.3, not of 0.4
    wide = select_plans(traces, list("abc"), WarmupConfig(plan_means_by="tag",
                                                          more_steps_margin=0.4))
    assert {len(t.rounds[0].plan.steps) for t in wide.plans} == {1}  # type: ignore[union-attr]


def test_a_plan_its_tag_ranks_first_is_rehearsed_and_then_learned_from_its_wrong_run() -> None:
    """Task a's conductor wrote the review plan once and drew a wrong answer; on b the review
    plan is right 4 of 4. Pooled over the tag the review plan is a's first candidate for
    rehearsal (its one run's very text); per task it is no candidate (no right run). Once the
    rehearsal has run that text and scored it, a learns it from the wrong run; rehearsals of
    other wording would not let it."""
    from conductor_engine.trainer.warmup import candidate_plans, select_plans

    wrong = tagged(_wrong(planned("a", REVIEW, 0.25, wording="Mine.")), "k")
    solo = [tagged(planned("a", SOLO, 1.0 if i else 0.25, minute=i), "k") for i in range(3)]
    _wrong(solo[0])
    sibling = [tagged(planned("b", REVIEW, 1.0, minute=i), "k") for i in range(4)]
    traces = [wrong, *solo, *sibling]
    cfg = WarmupConfig(rehearse=2, rehearse_plans=1)
    assert [len(p.steps) for p in candidate_plans(traces, ["a", "b"], cfg, "r")["a"]] == [1]
    pooled = revised(cfg, plan_means_by="tag")
    got = candidate_plans(traces, ["a", "b"], pooled, "r")["a"]
    assert [s.subtask for s in got[0].steps] == ["Mine. (0)", "Mine. (1)"]

    def rehearsals(wording: str) -> list[Trace]:
        return [tagged(planned("a", REVIEW, 1.0, wording=wording, fixed_in="r", minute=i), "k")
                for i in range(4)]

    learned = select_plans([*traces, *rehearsals("Mine.")], ["a"], pooled, "r")
    assert [t.workflow_id for t in learned.plans] == [wrong.workflow_id]
    other = select_plans([*traces, *rehearsals("Other.")], ["a"], pooled, "r")
    assert [len(t.rounds[0].plan.steps) for t in other.plans] == [1]  # type: ignore[union-attr]


def test_a_task_that_never_wrote_its_tags_first_plan_rehearses_and_learns_a_siblings() -> None:
    """Task a's conductor only ever wrote the one-step plan (right 1 of 3); on b the review
    plan is right 4 of 4, so the tag ranks it first. The rehearsal is offered b's text of it
    for a; once a's runs of that text are scored, a learns it: b's plan attempt under a's own
    prompt, credited with a's run. Before that rehearsal, and per task, a keeps its own plan."""
    from conductor_engine.trainer.warmup import candidate_plans, select_plans

    solo = [tagged(planned("a", SOLO, 1.0 if i == 2 else 0.25, minute=i), "k") for i in range(3)]
    for t in solo[:2]:
        _wrong(t)
    sibling = [tagged(planned("b", REVIEW, 1.0, wording="B's.", minute=i), "k")
               for i in range(4)]
    traces = [*solo, *sibling]
    cfg = WarmupConfig(rehearse=2, rehearse_plans=2, plan_means_by="tag")
    got = candidate_plans(traces, ["a", "b"], cfg, "r")
    assert [[s.subtask for s in p.steps] for p in got["a"]] == [["B's. (0)", "B's. (1)"],
                                                                ["Do it. (0)"]]
    assert [[s.subtask for s in p.steps] for p in got["b"]] == [["B's. (0)", "B's. (1)"]]
    before = select_plans(traces, ["a", "b"], cfg, "r")
    assert [(t.task.id, len(t.rounds[0].plan.steps)) for t in before.plans  # type: ignore[union-attr]
            ] == [("a", 1), ("b", 2)]
    rehearsed = [tagged(planned("a", REVIEW, 0.9 + i / 100, wording="B's.", fixed_in="r",
                                minute=10 + i), "k") for i in range(3)]
    learned = select_plans([*traces, *rehearsed], ["a", "b"], cfg, "r")
    a = learned.plans[0]
    assert a.task.id == "a" and a.rounds[0].plan == sibling[0].rounds[0].plan
    assert a.reward is not None and a.reward.value == 0.92  # a's best rehearsed run's
    assert a.policy.name == "teacher"  # the conductor that wrote the text
    assert [m.content for m in a.rounds[0].attempts[-1].prompt] == ["Plan a."]
    assert learned.conductors() == {"teacher": 2} and learned.tasks == 2
    # only this training run's rehearsal of that very text lets a learn it
    elsewhere = [revised(t, task=revised(t.task, batch="other")) for t in rehearsed]
    assert len(select_plans([*traces, *elsewhere], ["a", "b"], cfg, "r").plans[0]
               .rounds[0].plan.steps) == 1  # type: ignore[union-attr]


def test_a_plan_whose_last_step_never_sees_its_draft_is_neither_learned_nor_rehearsed() -> None:
    """The five-agent hand pool's sports kind: a plan that drafts with one agent and has
    another answer blind to the draft was right 7 of 8 (luck: it answers as the second agent
    alone), the second agent alone was written twice and right once. Ranked like any plan, the
    blind plan is learned and rehearsed first; with dead_steps "skip" the plan without the dead
    step is, and the blind plan's runs still count."""
    from conductor_engine.trainer.warmup import candidate_plans, has_dead_steps, select_plans

    blind: tuple[tuple[str, Access], ...] = (("wren", []), ("heron", []))
    alone: tuple[tuple[str, Access], ...] = (("heron", []),)
    drafted = [tagged(planned(task, blind, 1.0 if i else 0.25, minute=i), "sports")
               for task in "ab" for i in range(4)]
    _wrong(drafted[0])
    solo = [tagged(planned("a", alone, 1.0 if i else 0.25, minute=10 + i), "sports")
            for i in range(2)]
    _wrong(solo[0])
    traces = [*drafted, *solo]
    assert has_dead_steps(drafted[0]) and not has_dead_steps(solo[0])
    cfg = WarmupConfig(rehearse=8, rehearse_plans=1, plan_means_by="tag")
    learn = select_plans(traces, ["a", "b"], cfg)
    assert learn.shapes() == {"2 steps (apart)": 2}
    assert [[s.agent for s in p.steps] for p in candidate_plans(traces, ["a"], cfg)["a"]
            ] == [["wren", "heron"]]
    skip = revised(cfg, dead_steps="skip")
    chosen = select_plans(traces, ["a", "b"], skip)
    assert [t.workflow_id for t in chosen.plans] == [solo[1].workflow_id]
    assert chosen.counted_runs == 10 and chosen.ranked_plans == 3  # a: 2 plans, b: 1
    assert [[s.agent for s in p.steps] for p in candidate_plans(traces, ["a"], skip)["a"]
            ] == [["heron"]]
    by_run = select_plans(traces, ["a", "b"], WarmupConfig(rank="run", dead_steps="skip"))
    assert [t.workflow_id for t in by_run.plans] == [solo[1].workflow_id]
    assert by_run.left_out == {"dead_step": 6, "not_correct": 3}


def test_of_two_plans_whose_means_differ_by_less_than_their_error_the_cheaper_is_learned(
        ) -> None:
    """Task a's review drafted by a costly generalist is right 9 times in 10 ($0.025 a run);
    drafted by the cheap drafter, 17 times in 20 ($0.002): means 0.925 and 0.8875, a gap of
    0.04 against a standard error of the difference of 0.097. By the mean the costly plan is
    learned; with ties_within_se 0.5 the two tie and the cheaper is. The cheap agent alone,
    right 5 times in 10, is no tie (0.3 below) and stays out. Pooled by tag over tasks a and
    b, the same."""
    from conductor_engine.trainer.warmup import select_plans

    costly: tuple[tuple[str, Access], ...] = (("generalist", []), ("reviewer", "all"))

    def runs(task: str, plan: tuple[tuple[str, Access], ...], right: int, n: int,
             cost: float) -> list[Trace]:
        return [tagged(planned(task, plan, 1.0, cost=cost, minute=i) if i < right
                       else _wrong(planned(task, plan, 0.25, cost=cost, minute=i)), "k")
                for i in range(n)]

    traces = [*runs("a", costly, 9, 10, 0.025), *runs("a", REVIEW, 17, 20, 0.002),
              *runs("a", SOLO, 5, 10, 0.001)]
    agents: dict[float, list[list[str]]] = {}
    for ties in (0.0, 0.5):
        cfg = WarmupConfig(more_steps_margin=0.1, ties_within_se=ties)
        chosen = select_plans(traces, ["a"], cfg).plans
        agents[ties] = [[s.agent for s in t.rounds[0].plan.steps] for t in chosen]  # type: ignore[union-attr]
    assert agents == {0.0: [["generalist", "reviewer"]], 0.5: [["drafter", "reviewer"]]}
    # pooled over the tag: task b holds half of each plan's runs
    split = [revised(t, task=revised(t.task, id="b")) if i % 2 else t
             for i, t in enumerate(traces)]
    pooled = select_plans(split, ["a", "b"], WarmupConfig(
        plan_means_by="tag", more_steps_margin=0.1, ties_within_se=0.5))
    assert {t.rounds[0].plan.steps[0].agent for t in pooled.plans} == {"drafter"}  # type: ignore[union-attr]
    assert len(pooled.plans) == 2


def test_rehearsal_asks_for_plan_means() -> None:
    """Rehearsed runs count towards a plan's mean: with rank "run" they would count for
    nothing, so the recipe says so."""
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="rank = \"plan_mean\""):
        WarmupConfig(rank="run", rehearse=2)
    assert not WarmupConfig(rehearse=2).rehearses  # [warmup] enabled = false
    assert WarmupConfig(enabled=True, rehearse=2).rehearses
    assert not WarmupConfig(enabled=True, rehearse=2, rehearse_plans=0).rehearses


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


def test_learning_decisions_only_keeps_a_plans_choices_in_the_loss_and_reads_its_words() -> None:
    """`learn = "decisions"`: of a plan with recorded choices only those positions are trained
    (the agent's name, the access, the `,` or `]`), its subtask's words and the grammar's
    forced text read as context; a plan without any (an API conductor's) is learned whole,
    and the default learns every token the grammar did not force."""
    from conductor_engine.trainer.grpo import Sample
    from conductor_engine.trainer.warmup import decisions_only

    ids = list(range(10, 22))
    chosen = Sample(prompt_ids=[1], completion_ids=ids, advantage=1.0,
                    forced=[k < 3 for k in range(12)], choices={4: [14, 40], 9: [19, 41]})
    assert decisions_only(chosen).trained_tokens == 2
    assert [k for k, f in enumerate(chosen.forced or []) if not f] == [4, 9]
    api = Sample(prompt_ids=[1], completion_ids=ids, advantage=1.0)
    assert decisions_only(api).trained_tokens == 12
    assert WarmupConfig().learn == "plan"
    assert WarmupConfig.model_validate({"learn": "decisions"}).learn == "decisions"
