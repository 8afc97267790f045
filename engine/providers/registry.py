"""The providers: each name a pool file may give, the module that calls it, and what it can do.

Adding a provider touches three files: its module (a `Provider`, protocol.py: `complete`,
`preload` and its `CAPABILITIES`), this one (its name in ProviderName and MODULES) and
protocol.py (the line that has the type checker check the module). Importing a provider module
is cheap (each imports its SDK on first call, or in its `preload`), so reading a declaration
costs no SDK.

This module imports nothing of the engine's but the contracts (the provider names): the pool
reads it while it loads, and base.py, which every provider module imports, imports the pool.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, get_args

from conductor_engine.engine.contracts.agents import ProviderName

TrainedVersions = Literal["checkpoint", "served"]
"""How a provider runs a trained policy version of the conductor. "checkpoint": it loads the
version's files itself, on top of the agent's `model` (which is therefore the base the trainer
trains); "served": its server serves the version under the name NAME-vK, a LoRA version loaded
into it at runtime (vLLM; engine/providers/serving.py), so the base is the model that server
runs."""


@dataclass(frozen=True)
class Capabilities:
    """What a provider can do, declared by its module as `CAPABILITIES` (name -> Capabilities,
    for each provider name it serves) and read through `capabilities(name)`: by the pool (which
    web search options an agent may set), the plan activity (JSON mode; serving a trained
    version) and the trainer's CLI (what base model a version trains)."""

    structured_output: bool = False
    """It can constrain decoding to a JSON schema (`CompletionRequest.json_schema`)."""
    web_search_options: frozenset[str] | None = None
    """None: no web search tool of its own. Else the WebSearch options it honours (an empty
    set: it searches, but takes no options)."""
    trained_versions: TrainedVersions | None = None
    """How it serves a trained conductor version; None: it cannot."""
    explores: bool = False
    """It honours `CompletionRequest.explore` (and records the mixture's log-probs)."""



MODULES: dict[str, str] = {
    "openai": "conductor_engine.engine.providers.openai_provider",
    "openai-compatible": "conductor_engine.engine.providers.openai_provider",
    "anthropic": "conductor_engine.engine.providers.anthropic_provider",
    "google": "conductor_engine.engine.providers.google_provider",
    "local": "conductor_engine.engine.providers.local",
    "sim": "conductor_engine.engine.providers.sim",
}
"""Each provider name's module (protocol.provider_module imports it on first use)."""
assert set(MODULES) == set(get_args(ProviderName)), "a provider without a module, or vice versa"


def capabilities(provider: str) -> Capabilities:
    """What `provider` can do, as its module declares it. The module is imported here by name,
    not through protocol.provider_module: the pool calls this while it loads, below the provider
    modules that protocol.py names; the declaration's type is checked there
    (`Provider.CAPABILITIES`)."""
    declared: Mapping[str, Capabilities] = importlib.import_module(MODULES[provider]).CAPABILITIES
    return declared[provider]


def web_search_providers() -> list[str]:
    """The providers with a web search tool of their own, in registry order."""
    return [p for p in MODULES if capabilities(p).web_search_options is not None]


def listed(names: list[str], last: str) -> str:
    """Names for a sentence: `a, b or c` with last="or"."""
    return f"{', '.join(names[:-1])} {last} {names[-1]}" if len(names) > 1 else "".join(names)
