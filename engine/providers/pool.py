"""The agent pool: which models the conductor may delegate to, read from a TOML file.

A pool file names API keys only by the environment variable that holds them, so a pool file
can be committed and shared, and no key ever reaches a log line or a workflow history. Each
agent is an AgentSpec (engine/contracts/agents.py, the value every layer carries); the pool
checks it against what its provider can do, which the contracts cannot know.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from conductor_engine.engine.contracts.agents import (
    AgentSpec,
    GenerationParams,
    ProviderName,
    SimSettings,
    UserLocation,
    WebSearch,
)
from conductor_engine.engine.providers.registry import (
    capabilities,
    listed,
    web_search_providers,
)
from conductor_engine.engine.toml_errors import not_utf8, toml_error, toml_lines, utf8_text

__all__ = ["AgentSpec", "GenerationParams", "Pool", "PoolAgent", "PoolError", "ProviderName",
           "SimSettings", "UserLocation", "WebSearch"]

MAX_LISTED = 3  # problems a PoolError names; it counts the rest


class PoolError(ValueError):
    """A pool file that cannot be used; the message says which file and what to fix."""


def _native_web_search(self: AgentSpec) -> AgentSpec:
    """An agent's web search, as its provider declares it (engine/providers/registry.py).
    Only providers with a search tool of their own can search, and only with the
    options that provider offers (its declared capabilities): an option a provider lacks is
    an error here rather than silently dropped, so a person who restricts domains never gets
    an unrestricted search without knowing it. Says which agent and what to change."""
    if not self.searches_web or self.web_search is None:
        return self
    supported = capabilities(self.provider).web_search_options
    if supported is None:
        raise ValueError(
            f"agent {self.id!r}: web_search needs a provider with its own search tool "
            f"({listed(web_search_providers(), 'or')}), not {self.provider}; remove "
            f"web_search from this agent or move it to one of those providers"
        )
    unsupported = [o for o in self.web_search.options_set() if o not in supported]
    if unsupported:
        offered = ", ".join(sorted(supported)) or "no options (only enabled)"
        raise ValueError(
            f"agent {self.id!r}: {self.provider} web search does not support "
            f"{', '.join(unsupported)}; it takes {offered}"
        )
    return self


PoolAgent = Annotated[AgentSpec, AfterValidator(_native_web_search)]
"""An agent of a pool: an AgentSpec whose web search its provider can run."""


class Pool(BaseModel):
    """The conductor and the agents it may delegate to."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    conductor: PoolAgent
    agents: list[PoolAgent] = Field(min_length=1)
    offer_conductor_as_agent: bool = Field(
        default=True, description="list the conductor itself in the pool (self-calls)"
    )

    @model_validator(mode="after")
    def _unique_ids(self) -> Pool:
        ids = [a.id for a in self.agents]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"agent ids must be unique; repeated: {', '.join(dupes)}")
        if self.conductor.id in ids:
            raise ValueError(
                f"the conductor id {self.conductor.id!r} is also an agent id; the conductor is "
                f"offered to itself through offer_conductor_as_agent"
            )
        if self.conductor.provider == "sim":
            raise ValueError(
                f"the conductor {self.conductor.id!r} has provider \"sim\", but a sim agent only "
                f"answers tasks and cannot write plans; give the conductor a real model (local, "
                f"say) and use sim for the agents it delegates to"
            )
        if self.conductor.searches_web:
            raise ValueError(
                f"the conductor {self.conductor.id!r} has web_search, but the conductor only "
                f"writes plans (its self-calls are sub-plans); give web_search to agents instead"
            )
        return self

    @classmethod
    def load(cls, path: str | Path | None = None) -> Pool:
        """Read and validate a pool file; None loads the shipped default pool."""
        if path is None:
            pools = resources.files("conductor_engine.engine.providers.pools")
            text = (pools / "default.toml").read_text()
            where = "the default pool"
        else:
            p = Path(path)
            if not p.is_file():
                raise PoolError(f"pool file {p} does not exist; pass an existing TOML file")
            where = str(p)
            try:
                text = utf8_text(p.read_bytes())
            except UnicodeDecodeError as e:
                raise PoolError(f"pool file {not_utf8(p, e)}") from None
            except OSError as e:
                raise PoolError(f"pool file {p}: cannot read it: {e.strerror}") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise PoolError(f"pool file {toml_error(where, e)}") from None
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            lines = toml_lines(text)
            problems = []
            for error in e.errors():
                loc = tuple(error["loc"])
                line = next((lines[loc[:n]] for n in range(len(loc), 0, -1)
                             if loc[:n] in lines), None)
                at = f"{where}:{line}" if line is not None else where
                field = ".".join(str(x) for x in loc) or "top level"
                problems.append(f"{at}: invalid at {field}: {error['msg']}")
            more = "".join(f"; also {p}" for p in problems[1:MAX_LISTED])
            count = f" ({len(problems)} problems in all)" if len(problems) > MAX_LISTED else ""
            raise PoolError(f"pool file {problems[0]}{more}{count}") from e

    def available(self, env: Mapping[str, str] | None = None) -> list[AgentSpec]:
        """The agents offered to the conductor: those configured here, plus the conductor."""
        out = [a for a in self.agents if a.is_configured(env)]
        if self.offer_conductor_as_agent:
            out.append(self.conductor)
        return out

    def get(self, agent_id: str) -> AgentSpec:
        if agent_id == self.conductor.id:
            return self.conductor
        for a in self.agents:
            if a.id == agent_id:
                return a
        known = ", ".join([a.id for a in self.agents] + [self.conductor.id])
        raise PoolError(f"unknown agent {agent_id!r}; the pool has: {known}")
