"""Which agents an eval leaves out before it starts (engine/eval/usable.py: `unusable`, and
`eval_agents` with the refusals), and what the conductor's runs may then delegate to
(engine/eval/systems.py)."""

from __future__ import annotations

import socket

import pytest

from conductor_engine.engine.contracts.tasks import Task
from conductor_engine.engine.eval import EvalSpec, eval_tasks
from conductor_engine.engine.eval.usable import described, eval_agents, unusable
from conductor_engine.engine.providers.pool import AgentSpec, Pool


def _agent(agent_id: str, **fields: object) -> AgentSpec:
    return AgentSpec.model_validate({"id": agent_id, "provider": "openai-compatible",
                                     "model": "m", **fields})


def _closed_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_agents_without_their_key_or_server_are_left_out_with_the_reason() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        up = listening.getsockname()[1]
        gone = _closed_port()
        agents = [
            _agent("keyed", provider="openai", api_key_env="EVAL_TEST_KEY"),
            _agent("keyless", provider="anthropic", api_key_env="EVAL_TEST_MISSING"),
            _agent("served", base_url=f"http://127.0.0.1:{up}/v1"),
            _agent("down", base_url=f"http://127.0.0.1:{gone}/v1"),
            _agent("nowhere", base_url="http://no-such-host.invalid/v1"),
            _agent("rehearsal", provider="sim", model="sim"),
        ]
        left_out = unusable(agents, {"EVAL_TEST_KEY": "sk-x"}, timeout=5)
    assert list(left_out) == ["keyless", "down", "nowhere"], "in pool order"
    assert left_out["keyless"] == "EVAL_TEST_MISSING not set"
    assert left_out["down"].startswith(f"127.0.0.1:{gone} unreachable")
    assert left_out["nowhere"] == "no-such-host.invalid not found"
    assert described({"keyless": left_out["keyless"]}) == "keyless (EVAL_TEST_MISSING not set)"


def test_no_server_is_probed_through_a_proxy() -> None:
    """The SDKs connect through the proxy; a direct probe would call a good server gone."""
    down = _agent("down", base_url=f"http://127.0.0.1:{_closed_port()}/v1")
    assert unusable([down], {"HTTPS_PROXY": "http://proxy:3128"}) == {}


def test_the_conductors_runs_delegate_only_to_the_agents_kept() -> None:
    spec = EvalSpec(agents=["a"], baselines=["single"], conductor_agents=["a", "conductor"])
    own = Task(id="t2", question="q?", agents=["b", "a"])
    runs = eval_tasks([Task(id="t1", question="q?"), own,
                       Task(id="t3", question="q?", agents=["b"])], spec)
    by_id = {t.id: t.agents for t in runs}
    assert by_id == {"conductor~t1": ["a", "conductor"], "single a~t1": None,
                     "conductor~t2": ["a"], "single a~t2": ["b", "a"],
                     "conductor~t3": ["b"], "single a~t3": ["b"]}
    whole = eval_tasks([own], spec.model_copy(update={"conductor_agents": None}))
    assert whole[0].agents == ["b", "a"], "nothing left out: the task's own agents"


def _pool(conductor: dict[str, object], *agents: AgentSpec, offered: bool = False) -> Pool:
    return Pool.model_validate({
        "conductor": {"id": "conductor", "provider": "local", "model": "tiny", **conductor},
        "agents": [a.model_dump() for a in agents], "offer_conductor_as_agent": offered})


def test_an_eval_runs_the_agents_that_can_and_its_conductor_delegates_only_to_them() -> None:
    keyed = _agent("keyed", provider="openai", api_key_env="EVAL_TEST_KEY")
    keyless = _agent("keyless", provider="openai", api_key_env="EVAL_TEST_MISSING")
    env = {"EVAL_TEST_KEY": "sk-x"}
    picked = eval_agents(_pool({}, keyed, keyless, offered=True), env=env)
    assert picked.agents == ["keyed"]
    assert picked.conductor_agents == ["keyed", "conductor"], "offered to itself: kept"
    assert picked.left_out == {"keyless": "EVAL_TEST_MISSING not set"}
    assert eval_agents(_pool({}, keyed), env=env).conductor_agents is None, "none left out"
    everyone = eval_agents(_pool({}, keyed, keyless), include=True, env=env)
    assert (everyone.agents, everyone.conductor_agents) == (["keyed", "keyless"], None)


def test_an_eval_whose_conductor_aggregator_or_every_agent_cannot_run_is_refused() -> None:
    keyed = _agent("keyed", provider="openai", api_key_env="EVAL_TEST_KEY")
    keyless = _agent("keyless", provider="openai", api_key_env="EVAL_TEST_MISSING")
    env = {"EVAL_TEST_KEY": "sk-x"}
    remote = {"provider": "openai", "model": "gpt", "api_key_env": "EVAL_TEST_MISSING"}
    with pytest.raises(ValueError, match=r"^the conductor 'conductor' cannot run here "
                       r"\(EVAL_TEST_MISSING not set\): .*--pool"):
        eval_agents(_pool(remote, keyed), env=env)
    with pytest.raises(ValueError, match=r"^--aggregator keyless cannot run here .*"
                       r"--include-unusable"):
        eval_agents(_pool({}, keyed, keyless), aggregator="keyless", env=env)
    with pytest.raises(ValueError, match=r"^no agent of the pool can run here: keyless "):
        eval_agents(_pool({}, keyless), env=env)
