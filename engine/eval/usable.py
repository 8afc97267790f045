"""Which of a pool's agents can run here, decided before an eval starts.

An eval runs every task once per system; an agent that cannot be called (its key is not set, its
server does not answer) would fail every run of its systems and of the baselines that use it,
and a row of failures is no result. So `conductor eval` leaves such agents out before anything
starts, saying which and why in one line, and `--include-unusable` keeps them.

Two checks, both where the command runs: the key, as `conductor pool show` decides `usable`
(`AgentSpec.is_configured`); and for an agent with its own `base_url` (a vLLM or other
OpenAI-compatible server), whether a TCP connection to it opens within PROBE_TIMEOUT_S. Public
APIs are not probed (their reachability is the network's, and a call pays for itself), and no
probe is made when a proxy is configured (the SDKs connect through it, a direct probe would
not).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from conductor_engine.engine.providers.pool import AgentSpec, Pool

PROBE_TIMEOUT_S = 2.0
"""How long a server is given to accept a connection before it counts as unreachable."""

PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                   "all_proxy")


def missing_key(agent: AgentSpec, env: Mapping[str, str] | None = None) -> str | None:
    """Why `agent` cannot be called for want of a key (as `pool show` says `usable: no`), or
    None when it can."""
    if agent.is_configured(env):
        return None
    if agent.api_key_env:
        return f"{agent.api_key_env} not set"
    return "no api_key_env and no base_url"


def unreachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the server at `url` cannot be reached (a TCP connection to its host and port), or
    None when it accepts one."""
    parts = urlsplit(url)
    host = parts.hostname
    if not host:
        return f"{url} names no host"
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return f"{url} has an invalid port"
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except socket.gaierror:
        return f"{host} not found"
    except TimeoutError:
        return f"{host}:{port} did not answer in {timeout:g} s"
    except OSError as e:
        return f"{host}:{port} unreachable ({e.strerror or e})"


def unusable(agents: Sequence[AgentSpec], env: Mapping[str, str] | None = None, *,
             timeout: float = PROBE_TIMEOUT_S) -> dict[str, str]:
    """{agent id: why it cannot run here}, in the order given, for the agents that cannot:
    a key not set, or a server of their own that does not accept a connection (probed in
    parallel, at most `timeout` seconds in all)."""
    env = os.environ if env is None else env
    why: dict[str, str] = {}
    probed: list[AgentSpec] = []
    proxied = any(env.get(v) for v in PROXY_VARIABLES)
    for agent in agents:
        key = missing_key(agent, env)
        if key is not None:
            why[agent.id] = key
        elif agent.base_url and agent.provider not in ("local", "sim") and not proxied:
            probed.append(agent)
    if probed:
        with ThreadPoolExecutor(max_workers=min(16, len(probed))) as pool:
            answers = pool.map(lambda a: unreachable(a.base_url or "", timeout), probed)
            for agent, answer in zip(probed, answers, strict=True):
                if answer is not None:
                    why[agent.id] = answer
    return {a.id: why[a.id] for a in agents if a.id in why}


def described(left_out: Mapping[str, str]) -> str:
    """`id (why), id (why)` for a one-line message."""
    return ", ".join(f"{agent} ({why})" for agent, why in left_out.items())


INCLUDE_HINT = "--include-unusable runs them anyway"


@dataclass
class EvalAgents:
    """Who takes part in an eval: the agents its systems run, the agents its conductor runs
    may use (None: the whole pool), and those left out with why."""

    agents: list[str]
    conductor_agents: list[str] | None = None
    left_out: dict[str, str] = field(default_factory=dict)


def eval_agents(pool: Pool, *, include: bool = False, aggregator: str | None = None,
                env: Mapping[str, str] | None = None) -> EvalAgents:
    """The pool's agents an eval runs. Unless `include`, the agents that cannot run here
    (`unusable`) are left out, and the conductor's runs may use only the rest (with the
    conductor itself where the pool offers it as an agent). ValueError (one line, what to do)
    when the conductor or the `aggregator` cannot run, or no agent of the pool can."""
    everyone = [a.id for a in pool.agents]
    if include:
        return EvalAgents(everyone)
    left_out = unusable([pool.conductor, *pool.agents], env)
    if pool.conductor.id in left_out:
        raise ValueError(f"the conductor {pool.conductor.id!r} cannot run here "
                         f"({left_out[pool.conductor.id]}): fix that, or use a pool whose "
                         f"conductor can (--pool)")
    if aggregator in left_out:
        raise ValueError(f"--aggregator {aggregator} cannot run here ({left_out[aggregator]}): "
                         f"choose another agent, or {INCLUDE_HINT}")
    kept = [a for a in everyone if a not in left_out]
    if not kept:
        raise ValueError(f"no agent of the pool can run here: {described(left_out)}; set their "
                         f"keys or start their servers (`conductor pool show`), or "
                         f"{INCLUDE_HINT}")
    if not left_out:
        return EvalAgents(kept)
    conductor_agents = kept + ([pool.conductor.id] if pool.offer_conductor_as_agent else [])
    return EvalAgents(kept, conductor_agents, left_out)
