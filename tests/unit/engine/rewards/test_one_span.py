"""One answer per reply: the exact, choice and math verifiers judge one span, and a reply that
states two different answers is wrong against every reference, never right twice. The property
tests build replies from the spans models write (boxes, answer lines, "the answer is" phrases,
bare values, alternatives) with a seeded generator and judge each against every reference of
its task kind: at most one may call it right."""

from __future__ import annotations

import random

import pytest

from conductor_engine.engine.rewards import verify
from conductor_engine.engine.rewards.extract import answer_spans
from conductor_engine.engine.rewards.verifiers import chosen_letter

FILLER = ["Let me think step by step.", "Consider each case in turn.", "So", "Hence,",
          "We check the other option too.", "", "Therefore"]


def _reply(rng: random.Random, forms: list[str], values: list[str]) -> str:
    parts = []
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.4:
            parts.append(rng.choice(FILLER))
        a, b = rng.sample(values, 2)
        parts.append(rng.choice(forms).format(a=a, b=b))
    return rng.choice([" ", "\n", "\n\n"]).join(parts)


def _right_against(reply: str, references: list[str], verifier: str) -> list[str]:
    return [r for r in references if verify(reply, r, verifier, timeout_s=6).correct]


EXACT_FORMS = ["\\boxed{{{a}}}", "$\\boxed{{\\text{{{a}}}}}$", "Answer: {a}",
               "**Final answer:** {a}", "The answer is {a}.", "the answer is {a}, I think",
               "{a}", "{a} or {b}",
               "I'd say {a}.", "Answer: {a}. Answer: {b}", "answer: {a} / {b}", "**{a}**"]
EXACT_VALUES = ["Paris", "London", "yes", "no", "Rome"]

CHOICE_FORMS = ["({a})", "{a}.", "Answer: {a}", "\\boxed{{{a}}}", "The answer is {a}",
                "{a} is correct", "the answer is option {a}", "{a} or {b}", "**{a}**", "{a}",
                "Answer: ({a}) or ({b})", "I pick {a}/{b}", "Between {a} and {b}, {a}."]
CHOICE_VALUES = ["A", "B", "C", "D", "E"]

MATH_FORMS = ["\\boxed{{{a}}}", "Answer: {a}", "The answer is {a}.", "${a}$", "{a}",
              "{a} or {b}", "The answer is {a} or {b}", "\\boxed{{{a}, {b}}}", "x = {a}",
              "Final answer: $\\boxed{{{a}}}$", "so it is {a}.0", "\\boxed{{\\frac{{2*{a}}}{{2}}}}"]
MATH_VALUES = ["1", "2", "3", "4"]


def test_no_exact_reply_is_right_against_two_references() -> None:
    rng = random.Random(46)
    for _ in range(1500):
        reply = _reply(rng, EXACT_FORMS, EXACT_VALUES)
        assert len(_right_against(reply, EXACT_VALUES, "exact")) <= 1, reply


def test_no_choice_reply_is_right_against_two_references() -> None:
    rng = random.Random(46)
    for _ in range(1500):
        reply = _reply(rng, CHOICE_FORMS, CHOICE_VALUES)
        assert len(_right_against(reply, CHOICE_VALUES, "choice")) <= 1, reply


def test_no_math_reply_is_right_against_two_references() -> None:
    rng = random.Random(46)
    for _ in range(120):
        reply = _reply(rng, MATH_FORMS, MATH_VALUES)
        assert len(_right_against(reply, MATH_VALUES, "math")) <= 1, reply


HEDGES = [
    # (verifier, reply, the two references each of which it must NOT be right against)
    ("exact", "\\boxed{no}\n\nAnswer: yes", ("yes", "no")),
    ("exact", "Answer: yes\n\n\\boxed{no}", ("yes", "no")),
    ("exact", "Answer: Paris or London", ("Paris", "London")),
    ("exact", "Answer: Paris. Answer: London", ("Paris", "London")),
    ("exact", "Answer: Paris\nSo, all told, the answer is London.", ("Paris", "London")),
    ("exact", "The answer is Paris.\nAnswer: London", ("Paris", "London")),
    ("choice", "\\boxed{A}\nAnswer: B", ("A", "B")),
    ("choice", "Answer: A or B", ("A", "B")),
    ("choice", "The answer is (A) or (B).", ("A", "B")),
    ("choice", "Answer: A/B", ("A", "B")),
    ("choice", "Answer: A\nThe answer is B.", ("A", "B")),
    ("choice", "Answer: A. Option B is correct.", ("A", "B")),
    ("choice", "**A** or **B**", ("A", "B")),
    ("choice", "(A), (B)", ("A", "B")),
    ("math", "\\boxed{1}\nAnswer: 2", ("1", "2")),
    ("math", "Answer: 2\n\\boxed{1}", ("1", "2")),
    ("math", "The answer is 1 or 2", ("1", "2")),
    ("math", "Answer: 1\nSo the answer is 2.", ("1", "2")),
    ("math", "\\boxed{1} and later \\boxed{2}", ("1", "2")),
]


@pytest.mark.parametrize(("verifier", "reply", "references"), HEDGES)
def test_a_hedged_reply_is_wrong_against_both_answers(verifier: str, reply: str,
                                                      references: tuple[str, str]) -> None:
    for reference in references:
        v = verify(reply, reference, verifier)
        assert v.correct is False and "error" not in v.details, (reference, v.reason)


@pytest.mark.parametrize(("verifier", "reply", "reference"), [
    ("exact", "The answer is Paris, the capital of France.\n\n**Final answer:** Paris", "Paris"),
    ("exact", "Final answer: $\\boxed{\\text{Paris}}$", "Paris"),
    ("exact", "\\boxed{Paris} ... so \\boxed{Paris}", "Paris"),
    ("exact", "The answer is not obvious at first.\nAnswer: Paris", "Paris"),
    ("exact", "Let us see what the answer is. We check.\nAnswer: Paris", "Paris"),
    ("exact", "The answer is that Paris is the capital.\n\\boxed{Paris}", "Paris"),
    ("choice", "Answer: B. Note that (C) is tempting but wrong.", "B"),
    ("choice", "The answer is clearly B because A ignores friction.", "B"),
    ("choice", "\\boxed{B}\nAnswer: (B)", "B"),
    ("math", "The answer is $\\frac{1}{2}$.\nAnswer: \\boxed{0.5}", "0.5"),
    ("math", "Final Answer: \\boxed{5}", "5"),
])
def test_stated_answers_that_agree_are_one_answer(verifier: str, reply: str,
                                                  reference: str) -> None:
    v = verify(reply, reference, verifier)
    assert v.correct, (v.reason, v.details)


def test_the_span_is_the_last_box_else_the_last_answer_line_else_the_reply() -> None:
    assert [s.text for s in answer_spans("Answer: 3\nthen \\boxed{4}")] == ["3", "4"]
    assert verify("Answer: 4\nthen \\boxed{4}", "4", "exact").details["found_by"] == "boxed"
    assert verify("x\nAnswer: 4", "4", "exact").details["found_by"] == "line"
    assert verify("4", "4", "exact").details["found_by"] == "reply"
    assert chosen_letter("I'd go with D") == ("D", "last standalone letter")


def test_a_percent_reads_as_one_number() -> None:
    """math-verify reads "50%" as 50 and as 0.5: right against two references. Here it is 50."""
    assert [r for r in ("50", "0.5", "\\frac{1}{2}") if verify("\\boxed{50\\%}", r, "math").correct
            ] == ["50"]
    assert verify("The answer is 5%.", "5", "math").correct


@pytest.mark.parametrize(("span", "letters"), [
    ("C", ["C"]), ("(c)", ["C"]), ("C. Paris", ["C"]), ("option C", ["C"]),
    ("C, not D", ["C"]), ("(B), since (A) fails", ["B"]), ("I think B", ["B"]),
    ("A or B", ["A", "B"]), ("(A), (B)", ["A", "B"]), ("A/B", ["A", "B"]),
    ("B and C", ["B", "C"]), ("42", []), ("a dog", []), ("A bird flies", []),
])
def test_a_stated_choice_names_its_letters(span: str, letters: list[str]) -> None:
    from conductor_engine.engine.rewards.verifiers import span_letters

    assert span_letters(span) == letters
