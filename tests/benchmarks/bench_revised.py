"""The cost of changing a model through its checks (`revised`) against the unchecked
`model_copy(update=...)` it replaced, on the shapes the hot paths change.

    python -m tests.benchmarks.bench_revised [--number 2000] [--repeat 5]

No servers; a few seconds. Each case is timed `--number` times, best of `--repeat`; printed
are microseconds a call for both, their ratio, and, for scale, the revised change against
serialising the same model to JSON once (which every Temporal payload and trace write does):
- batch child: a task's options and the task (workflows/batch.py, workflows/conduct.py);
- reconstructed trace: a 3-step trace with its round replaced (trainer/reconstruct.py);
- group of 8: a rollout group with its traces reordered (trainer/rollouts.py);
- small reward: a reward with its verdict's reasons cut (engine/contracts/records.py).
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.contracts.traces import PolicyRef
from conductor_engine.engine.rewards.rollouts import Group
from tests.traces import make_trace


def _cases() -> list[tuple[str, Callable[[], Any], Callable[[], Any], Callable[[], Any]]]:
    """(name, revised change, model_copy change, one JSON dump of the model changed)."""
    trace = make_trace("t-1", finished=datetime(2026, 1, 1, tzinfo=UTC))
    task = trace.task
    group = Group(task_id="t-1", policy=PolicyRef(name="conductor", version="v1"),
                  traces=[make_trace("t-1") for _ in range(8)])
    traces = list(reversed(group.traces))
    reward = trace.reward
    assert reward is not None and reward.verdict is not None
    verdict = reward.verdict
    rounds = list(trace.rounds)
    return [
        ("batch child (options + task)",
         lambda: revised(task, batch="b", options=revised(task.options, result="summary")),
         lambda: task.model_copy(update={"batch": "b", "options": task.options.model_copy(
             update={"result": "summary"})}),
         task.model_dump_json),
        ("reconstructed trace (rounds)", lambda: revised(trace, rounds=rounds),
         lambda: trace.model_copy(update={"rounds": rounds}), trace.model_dump_json),
        ("group of 8 (traces)", lambda: revised(group, traces=traces),
         lambda: group.model_copy(update={"traces": traces}), group.model_dump_json),
        ("small reward (verdict, reason)",
         lambda: revised(reward, reason="", verdict=revised(verdict, reason="", details={})),
         lambda: reward.model_copy(update={"reason": "", "verdict": verdict.model_copy(
             update={"reason": "", "details": {}})}),
         reward.model_dump_json),
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--number", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()

    def us(fn: Callable[[], Any]) -> float:
        return min(timeit.repeat(fn, number=args.number, repeat=args.repeat)) / args.number * 1e6

    print(f"{'case':32} {'revised µs':>11} {'model_copy µs':>14} {'ratio':>7} {'JSON dump µs':>13}"
          f" {'revised/dump':>13}")
    for name, checked, unchecked, dump in _cases():
        a, b, d = us(checked), us(unchecked), us(dump)
        print(f"{name:32} {a:11.2f} {b:14.2f} {a / b:7.1f} {d:13.2f} {a / d:13.2f}")


if __name__ == "__main__":
    main()
