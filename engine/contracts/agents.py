"""An agent as the pool file describes it: one model in the pool (or the conductor itself), with
its sampling settings, prices, timeouts, web search tool and, for a sim agent, its skills.

The pool loader reads these from a TOML file (engine/providers/pool.py, which also checks each
agent against what its provider can do); the plan activity, the providers, the client and the
trainer's CLI all carry them, which is why they live here. A pool file names API keys only by the
environment variable that holds them, so no key reaches a log line or a workflow history.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from conductor_engine.engine.contracts.plans import DEFAULT_REASONING_MAX_CHARS, PlanForm
from conductor_engine.engine.contracts.policy_versions import LATEST, VersionPin
from conductor_engine.engine.redaction import looks_like_key

ProviderName = Literal["openai", "anthropic", "google", "openai-compatible", "local", "sim"]
"""The providers a pool file may name (each has its module: engine/providers/registry.py)."""


class GenerationParams(BaseModel):
    """Sampling settings passed to the provider for every call to this agent."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int = Field(default=1024, gt=0, description="completion budget; a reasoning "
                            "model's hidden reasoning counts against it (engine/providers/"
                            "budget.py: what `pool show` flags)")
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = Field(
        default=None, description="openai and openai-compatible only: how long a reasoning "
        "model (gpt-5, o-series; servers that take it) thinks; None = the model's default")


class UserLocation(BaseModel):
    """Where the searcher should appear to be, so local questions get local results."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    city: str | None = None
    region: str | None = None
    country: str | None = Field(
        default=None, pattern=r"^[A-Z]{2}$", description="two-letter ISO code, e.g. GB"
    )
    timezone: str | None = Field(default=None, description="IANA name, e.g. Europe/London")


class WebSearch(BaseModel):
    """The provider's own web search tool for one agent (OpenAI web search, Anthropic web
    search, Gemini grounding with Google Search). The provider runs the searches inside the one
    API call and returns the sources it cited; the engine makes no search requests of its own.
    """

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    enabled: bool = True
    max_uses: int | None = Field(default=None, gt=0, description="searches per call, at most")
    allowed_domains: list[str] = Field(default_factory=list)
    blocked_domains: list[str] = Field(default_factory=list)
    user_location: UserLocation | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_bool(cls, value: object) -> object:
        """`web_search = true` in a pool file is short for the defaults."""
        return {"enabled": value} if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _one_domain_list(self) -> WebSearch:
        if self.allowed_domains and self.blocked_domains:
            raise ValueError("web_search takes allowed_domains or blocked_domains, not both")
        return self

    def summary(self) -> str:
        """A short description for listings such as `conductor pool show`."""
        if not self.enabled:
            return "off"
        parts = [f"max {self.max_uses}"] if self.max_uses else []
        if self.allowed_domains:
            parts.append("only " + ", ".join(self.allowed_domains))
        if self.blocked_domains:
            parts.append("not " + ", ".join(self.blocked_domains))
        if self.user_location is not None:
            where = self.user_location.model_dump(exclude_none=True).values()
            parts.append("from " + ", ".join(where))
        return "on" + (f" ({'; '.join(parts)})" if parts else "")

    def options_set(self) -> list[str]:
        """The optional settings given, by field name (to check a provider honours them)."""
        return [
            name
            for name in ("max_uses", "allowed_domains", "blocked_domains", "user_location")
            if getattr(self, name)
        ]


Probability = Annotated[float, Field(ge=0.0, le=1.0)]


class SimSettings(BaseModel):
    """A simulated agent for rehearsals (provider "sim"): it answers a task with the task's
    reference with probability `skills[tag]` (the best of the task's tags; `default_skill` for a
    task with no listed tag) and with a wrong answer otherwise, drawn from a hash of (task,
    agent, sample, attempt) so a rerun repeats exactly. Tags match case-insensitively."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    skills: dict[str, Probability] = Field(
        default_factory=dict, description="task tag -> probability of a right answer"
    )
    default_skill: Probability = Field(
        default=0.5, description="probability of a right answer on a task with no listed tag"
    )
    latency_s: float = Field(default=0.0, ge=0, description="seconds every call takes")
    latency_jitter_s: float = Field(
        default=0.0, ge=0, description="up to this much more, drawn per call (repeatably)"
    )
    output_tokens: int = Field(
        default=200, ge=0, description="reported per call (at most the call's max_tokens)"
    )
    input_tokens_per_char: float = Field(
        default=0.25, ge=0, description="reported input tokens = prompt characters x this"
    )
    review: dict[str, Probability] = Field(
        default_factory=dict,
        description="task tag -> probability that this agent, when its step sees an earlier "
        "right answer (to the task, or to one part of a composite task), keeps it; otherwise "
        "it answers as usual (docs/how-to/rehearse-plans.md)",
    )
    default_review: Probability = Field(
        default=0.0,
        description="review rate for a tag `review` does not list (0: earlier answers change "
        "nothing, as before review existed)",
    )

    @field_validator("skills", "review")
    @classmethod
    def _distinct_tags(cls, skills: dict[str, float]) -> dict[str, float]:
        folded = [t.casefold() for t in skills]
        dupes = sorted({t for t in folded if folded.count(t) > 1})
        if dupes:
            raise ValueError(f"names a tag twice (tags ignore case): {', '.join(dupes)}")
        return skills

    def skill(self, tags: list[str]) -> float:
        """The probability of a right answer on a task with these tags."""
        return _best(self.skills, tags, self.default_skill)

    def review_rate(self, tags: list[str]) -> float:
        """The probability of keeping a right earlier answer on a task (or part) with these
        tags: the best listed rate of them, like `skill`."""
        return _best(self.review, tags, self.default_review)


def _best(table: dict[str, float], tags: list[str], default: float) -> float:
    by_tag = {t.casefold(): p for t, p in table.items()}
    known = [by_tag[t.casefold()] for t in tags if t.casefold() in by_tag]
    return max(known) if known else default


_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")


class AgentSpec(BaseModel):
    """One model in the pool (or the conductor itself)."""

    # a refused api_key_env may hold a key: no error repeats the input
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
    provider: ProviderName
    model: str = Field(min_length=1)
    base_url: str | None = None
    api_key_env: str | None = Field(
        default=None, description="NAME of the environment variable holding the key, never a key"
    )
    description: str = ""
    params: GenerationParams = Field(default_factory=GenerationParams)
    price_input_per_mtok: float | None = Field(
        default=None, ge=0,
        description="USD per million input tokens; unset = the genai-prices table's "
        "(engine/providers/prices.py), 0 for local and sim agents",
    )
    price_output_per_mtok: float | None = Field(
        default=None, ge=0, description="USD per million output tokens; unset as above"
    )
    timeout_s: float = Field(default=120.0, gt=0, description="one attempt (start-to-close)")
    structured_output: bool = Field(
        default=True,
        description="ask for the plan as constrained JSON where the backend supports it",
    )
    plan_form: PlanForm = Field(
        default="reasoning",
        description="conductor, under constrained JSON: 'reasoning' (the paper's form) writes "
        'free-text reasoning first, {"reasoning": ..., "steps": [...]}, then the plan; '
        "'bare' writes only {\"steps\": [...]} after a shorter prompt, the cheapest in "
        "tokens, for tiny conductors with a small max_tokens. A conductor answering in free "
        "text always reasons first",
    )
    reasoning_max_chars: int = Field(
        default=DEFAULT_REASONING_MAX_CHARS, ge=1, le=20_000,
        description="conductor, plan_form 'reasoning': the longest reasoning the JSON schema "
        "admits before the plan (keep it well inside params.max_tokens)",
    )
    policy_version: VersionPin = Field(
        default=LATEST,
        description="the conductor's weights version: 'latest' follows the newest version "
        "published in the policy registry (base until one is), 'base' or 'v3' pins one; "
        "recorded in every trace it plans",
    )
    checkpoint: str | None = Field(
        default=None,
        description="local provider: a trained checkpoint directory (LoRA adapter or full "
        "weights) applied to `model`; the engine sets it for published policy versions",
    )
    web_search: WebSearch | None = Field(
        default=None, description="the provider's own web search tool, for agent steps"
    )
    sim: SimSettings | None = Field(
        default=None,
        description='provider "sim" only: its skill matrix, latency and token counts '
        "(defaults when left out)",
    )

    @model_validator(mode="after")
    def _key_is_a_name(self) -> AgentSpec:
        """A pool file is shared, committed and shown; a key pasted where its variable's name
        belongs would travel with it. A name is upper-case letters, digits and underscores (the
        convention every provider documents); anything else, or anything shaped like a key, is
        refused without being repeated."""
        env = self.api_key_env
        if env is not None and (_ENV_NAME.fullmatch(env) is None or looks_like_key(env)):
            raise ValueError(
                f"agent {self.id!r}: api_key_env must be the NAME of an environment variable "
                "(upper-case letters, digits and underscores, like OPENAI_API_KEY), and what is "
                "there is not one; never put a key in a pool file: set "
                f'api_key_env = "{self.provider.upper().replace("-", "_")}_API_KEY" and export '
                "the key under that name"
            )
        return self

    @model_validator(mode="after")
    def _effort_where_it_is_taken(self) -> AgentSpec:
        """Only the OpenAI wire format has a reasoning-effort parameter; elsewhere it would be
        dropped without a word, and a person who asked for `high` would not know."""
        if self.params.reasoning_effort is not None and self.provider not in (
                "openai", "openai-compatible"):
            raise ValueError(
                f"agent {self.id!r}: params.reasoning_effort is for providers openai and "
                f"openai-compatible, not {self.provider}; remove it (this model's thinking is "
                "set by its own defaults) and give it a max_tokens with room to think")
        return self

    @model_validator(mode="after")
    def _sim_settings_for_sim_agents(self) -> AgentSpec:
        if self.provider == "sim":
            if self.sim is None:
                self.sim = SimSettings()
        elif self.sim is not None:
            raise ValueError(
                f"agent {self.id!r}: `sim` settings are for provider \"sim\" only, not "
                f"{self.provider}; remove `sim` or set provider = \"sim\""
            )
        return self

    @property
    def searches_web(self) -> bool:
        return self.web_search is not None and self.web_search.enabled

    def is_configured(self, env: Mapping[str, str] | None = None) -> bool:
        """True when the agent can be called here: local and sim agents always, others with a
        key set (or with a base URL, for servers such as vLLM that need none)."""
        env = os.environ if env is None else env
        if self.provider in ("local", "sim"):
            return True
        if self.api_key_env:
            return bool(env.get(self.api_key_env))
        return self.base_url is not None
