"""The cost of reading a reply's answers with the linear scanners against the regular
expressions they replaced.

    python -m tests.benchmarks.bench_reply_parsing [--replies 2000] [--repeat 5] [--spaces 20000]

Two workloads, each timed with the current code (`extract.answer_spans` and the choice rule)
and with the old patterns (re-stated below, as they were):
- typical: replies of a few KB of reasoning ending in a box, an "Answer:" line or "the answer
  is" phrase, the forms models write;
- hostile: "The answer is a" + N spaces + "b", which the old patterns backtrack on
  quadratically (the review's case, at N = 60,000, took over 12 s).
The figure is the best of `--repeat` runs of each, and the ratio new / old.
"""

from __future__ import annotations

import argparse
import random
import re
import time
from collections.abc import Callable
from typing import Any

from conductor_engine.engine.rewards.extract import answer_spans
from conductor_engine.engine.rewards.verifiers import chosen_letter

OLD_ANSWER_LINE = re.compile(
    r"^[ \t>#*_]*(?:final[ \t]+)?answer[ \t*_]*[:：][ \t*_]*(?P<value>.+?)[ \t*_]*$",
    re.IGNORECASE | re.MULTILINE,
)
OLD_ANSWER_IS = re.compile(r"\b(?:final\s+)?answer\s+is\s*:?\s*(?P<value>[^\n]+?)\s*(?:\.\s|\.?$)",
                           re.IGNORECASE | re.MULTILINE)
OLD_EXPLICIT_CHOICE = (
    re.compile(r"(?i:\banswer)\s*(?i:is)?\s*[:：]\s*[*_]*\s*[(\[]?([A-Ja-j])\b(?![-'])"),
    re.compile(r"(?i:\banswer\s+is)\s*(?i:option\s+)?[*_]*\s*(?:\(([A-Ja-j])\)|([A-J])\b)"),
)


def old_read(text: str) -> Any:
    """What the old verifiers ran on a reply: both answer-line patterns, the choice forms."""
    lines = [m.group("value") for rx in (OLD_ANSWER_LINE, OLD_ANSWER_IS) for m in rx.finditer(text)]
    letters = [m.groups() for rx in OLD_EXPLICIT_CHOICE for m in rx.finditer(text)]
    return lines, letters


def new_read(text: str) -> Any:
    return answer_spans(text), chosen_letter(text)


def typical(count: int) -> list[str]:
    rng = random.Random(7)
    words = ["we", "compute", "the", "sum", "of", "terms", "and", "check", "each", "case", "so",
             "value", "follows"]
    endings = ["\n\n**Final answer:** {a}", "\n\nThus $\\boxed{{{a}}}$.", "\nThe answer is {a}.",
               "\nAnswer: ({a})"]
    replies = []
    for _ in range(count):
        body = " ".join(rng.choice(words) for _ in range(rng.randint(200, 600)))
        replies.append(body + rng.choice(endings).format(a=rng.choice("ABCD")))
    return replies


def best(work: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replies", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--spaces", type=int, default=20_000,
                        help="the hostile reply's blank run (the old patterns: quadratic)")
    args = parser.parse_args()
    replies = typical(args.replies)
    hostile = "The answer is a" + " " * args.spaces + "b"
    rows = [
        ("typical", lambda: [new_read(r) for r in replies], lambda: [old_read(r) for r in replies],
         args.repeat),
        ("hostile", lambda: new_read(hostile), lambda: old_read(hostile), 1),
    ]
    print(f"{'workload':<10} {'new':>12} {'old':>12} {'new / old':>10}")
    for name, new, old, repeat in rows:
        t_new, t_old = best(new, repeat), best(old, repeat)
        print(f"{name:<10} {t_new * 1000:>9.1f} ms {t_old * 1000:>9.1f} ms {t_new / t_old:>10.3f}")


if __name__ == "__main__":
    main()
