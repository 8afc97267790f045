"""Whether an agent's completion budget or timeout is likely to cut its answers short, the
warning `conductor pool show` prints beside it.

A reasoning model (GPT-5 and the o-series, Gemini 2.5, DeepSeek-R1 and its distills, Qwen3 in
its thinking mode, QwQ) thinks in tokens that count against `max_tokens` before it writes a word
of its answer; on AIME or GPQA that thinking alone often runs past 10,000 tokens. With a small
budget the answer is cut off (a wrong verdict) or the call is retried (paid twice). The rule:

- an agent is a reasoning model when its pool entry sets `params.reasoning_effort`, or its
  model name matches REASONING_MODELS;
- a reasoning model is flagged when `params.max_tokens` < MIN_REASONING_TOKENS (16,384), or
  its `timeout_s` (one attempt) < MIN_REASONING_TIMEOUT_S (600 s: 16k tokens at ~30 tokens/s).
Other agents are not flagged: their budget is all answer, and short budgets can be right.

A heuristic, said as one: a model name can hide what it is, and a small budget can be right for
short subtasks. It warns; it never refuses a pool.
"""

from __future__ import annotations

import re

from conductor_engine.engine.providers.pool import AgentSpec

MIN_REASONING_TOKENS = 16_384
MIN_REASONING_TIMEOUT_S = 600.0
REASONING_MODELS = re.compile(
    r"(^|[/_.:-])(gpt-5|o[134](-|$)|o[134]-mini|gemini-2\.5|gemini-3|deepseek-r1|r1-distill"
    r"|qwq|qwen3(?!.*instruct-2507))", re.IGNORECASE)
"""Model names whose replies include hidden or visible reasoning by default. Qwen3's
`-Instruct-2507` releases do not think, and are left out."""


def reasons(agent: AgentSpec) -> bool:
    """Whether the agent is taken for a reasoning model (module docstring)."""
    if agent.params.reasoning_effort is not None:
        return True
    return agent.provider not in ("sim", "local") and REASONING_MODELS.search(agent.model) \
        is not None


def truncation_risk(agent: AgentSpec) -> str | None:
    """Why the agent's answers are likely to be cut short, or None."""
    if not reasons(agent):
        return None
    budget = agent.params.max_tokens
    if budget < MIN_REASONING_TOKENS:
        return (f"max_tokens {budget:,} < {MIN_REASONING_TOKENS:,}: a reasoning model's "
                "hidden reasoning counts against it")
    if agent.timeout_s < MIN_REASONING_TIMEOUT_S:
        return (f"timeout_s {agent.timeout_s:g} < {MIN_REASONING_TIMEOUT_S:g}: too short for "
                f"{budget:,} tokens of reasoning")
    return None
