"""GRPO groups in the trace store without running the conductor: `write_groups` stores, for each
task, a group of rollouts under one policy version, each with a prompt and completion tokens the
trainer can score, and rewards that differ within the group (so every update has a signal)."""

from __future__ import annotations

import random
from typing import Any

from conductor_engine.engine.contracts.agent_calls import Message
from conductor_engine.engine.contracts.traces import PolicyRef
from conductor_engine.engine.rewards.rollouts import Group, rollout_group
from conductor_engine.engine.storage.trace_store import TraceStore
from tests.traces import make_trace


async def write_groups(store: TraceStore, name: str, task_ids: list[str], *, group_size: int,
                       version: str = "base", completion_len: int = 48, vocab: int = 49152,
                       prompt_words: int = 0, seed: int = 0) -> None:
    """`group_size` rollouts of each task under `name` at `version`, half rewarded 1, half 0;
    `prompt_words` more words in each prompt make it about as long as a conductor's."""
    rng = random.Random(seed)
    padding = " ".join(f"w{rng.randrange(1000)}" for _ in range(prompt_words))
    for task_id in task_ids:
        for i in range(group_size):
            trace = make_trace(task_id, version=version, reward=float(i % 2))
            trace.policy = PolicyRef(name=name, version=version)
            attempt = trace.rounds[0].attempts[0]
            attempt.prompt = [Message(role="user",
                                      content=f"Plan task {task_id}: 2^10 or 10^3? {padding}")]
            attempt.token_ids = [rng.randrange(3, vocab) for _ in range(completion_len)]
            attempt.logprobs = [-rng.uniform(9.0, 12.0) for _ in range(completion_len)]
            attempt.finish_reason = "stop"
            await store.write(trace)


async def read_groups(store: TraceStore, policy: PolicyRef, **kw: Any) -> list[Group]:
    """The GRPO groups of `policy` as the trainer forms them: the store's runs
    (`TraceStore.group_runs`, same arguments), each run a rollout or left out."""
    return [rollout_group(g) for g in await store.group_runs(policy, **kw)]
