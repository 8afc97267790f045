"""Provider-native web search: asked for only where the pool enables it, citations kept.

Each provider runs through its real SDK against the scripted agent server, which answers with
citations in that provider's own wire format and records whether the search tool was requested.
The agent activity runs in temporalio's ActivityEnvironment, including a cancellation that must
reach a hung call through the activity's heartbeats.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from conductor_engine.activities.agent import AgentActivities
from conductor_engine.engine.contracts.activities import AgentCallInput
from conductor_engine.engine.contracts.records import AgentReply, StepRecord
from conductor_engine.engine.providers import (
    AgentCallError,
    Citation,
    CompletionRequest,
    Message,
    complete,
)
from conductor_engine.engine.providers import errors as E
from conductor_engine.engine.providers.pool import (
    AgentSpec,
    Pool,
    PoolError,
    UserLocation,
    WebSearch,
)
from conductor_engine.engine.tasks.files import load_jsonl
from tests.agent_server import AgentServer, Reply
from tests.paths import ROOT

PROVIDERS = ["openai", "anthropic", "google"]
KEY_ENV = "CONDUCTOR_TEST_AGENT_KEY"
KEY = "sk-test-not-a-real-key-0123456789"
EXAMPLES = ROOT / "examples" / "deep_research"

SOURCES = [
    Citation(url="https://example.org/voyager", title="Voyager", snippet="crossed in 2012"),
    Citation(url="https://example.com/nasa", title="NASA", snippet="August 25, 2012"),
]


@pytest.fixture
def server(agent_server: AgentServer, monkeypatch: pytest.MonkeyPatch) -> AgentServer:
    agent_server.reset()
    monkeypatch.setenv(KEY_ENV, KEY)
    return agent_server


def spec_for(server: AgentServer, provider: str, **fields: Any) -> AgentSpec:
    values: dict[str, Any] = {"api_key_env": KEY_ENV, "timeout_s": 5.0}
    values.update(fields)
    return server.spec(provider, "m", **values)


def ask(search: WebSearch | None = None) -> CompletionRequest:
    return CompletionRequest(
        messages=[
            Message(role="system", content="Cite your sources."),
            Message(role="user", content="When did Voyager 1 leave the heliosphere?"),
        ],
        web_search=search,
    )


# ------------------------------------------------------------------------- providers


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_search_is_requested_only_when_asked(server: AgentServer, provider: str) -> None:
    server.script("m", [Reply.ok("In 2012.", citations=SOURCES)])
    spec = spec_for(server, provider)

    plain = await complete(spec, ask())
    searched = await complete(spec, ask(WebSearch()))

    without, with_search = server.requests("m")
    assert not without.web_search and without.tools == []
    assert plain.citations == []  # a provider cites nothing it did not search for
    assert with_search.web_search
    assert searched.text == "In 2012."
    assert [(c.url, c.title) for c in searched.citations] == [(c.url, c.title) for c in SOURCES]


async def test_openai_without_search_keeps_chat_completions(server: AgentServer) -> None:
    await complete(spec_for(server, "openai"), ask())
    assert server.requests("m")[0].path == "/v1/chat/completions"


async def test_openai_search_uses_the_responses_api_tool(server: AgentServer) -> None:
    search = WebSearch(
        max_uses=4, allowed_domains=["nasa.gov"], user_location=UserLocation(country="US")
    )
    await complete(spec_for(server, "openai", params={"max_tokens": 900}), ask(search))

    (seen,) = server.requests("m")
    assert (seen.api, seen.path) == ("responses", "/v1/responses")
    assert seen.tools == [
        {
            "type": "web_search",
            "filters": {"allowed_domains": ["nasa.gov"]},
            "user_location": {"type": "approximate", "country": "US"},
        }
    ]
    assert seen.body["max_tool_calls"] == 4
    assert seen.body["store"] is False
    assert seen.system == "Cite your sources."
    assert seen.messages[-1]["role"] == "user"


async def test_anthropic_search_tool_carries_the_pool_settings(server: AgentServer) -> None:
    search = WebSearch(
        max_uses=2, blocked_domains=["example.net"], user_location=UserLocation(city="Oslo")
    )
    await complete(spec_for(server, "anthropic"), ask(search))
    assert server.requests("m")[0].tools == [
        {
            "type": "web_search_20250305",
            "name": "web_search",
            "max_uses": 2,
            "blocked_domains": ["example.net"],
            "user_location": {"type": "approximate", "city": "Oslo"},
        }
    ]


async def test_gemini_search_is_google_search_grounding(server: AgentServer) -> None:
    await complete(spec_for(server, "google"), ask(WebSearch()))
    assert server.requests("m")[0].tools == [{"googleSearch": {}}]


@pytest.mark.parametrize(
    ("provider", "snippets"),
    [
        ("openai", [None, None]),  # OpenAI gives positions of inline links, no passage
        ("anthropic", ["crossed in 2012", "August 25, 2012"]),  # the quoted source text
        ("google", ["crossed in 2012", "August 25, 2012"]),  # the supported answer text
    ],
)
async def test_citations_are_one_per_source_with_snippets(
    server: AgentServer, provider: str, snippets: list[str | None]
) -> None:
    repeated = [*SOURCES, Citation(url=SOURCES[0].url, title="Voyager", snippet="again")]
    server.script("m", [Reply.ok("In 2012.", citations=repeated)])
    done = await complete(spec_for(server, provider), ask(WebSearch()))
    assert [c.url for c in done.citations] == [c.url for c in SOURCES]
    assert [c.snippet for c in done.citations] == snippets


async def test_search_without_citations_is_an_empty_list(server: AgentServer) -> None:
    for provider in PROVIDERS:
        done = await complete(spec_for(server, provider), ask(WebSearch()))
        assert (done.text, done.citations) == ("ok", [])


async def test_openai_compatible_cannot_be_asked_to_search(server: AgentServer) -> None:
    with pytest.raises(AgentCallError) as info:
        await complete(server.spec("openai-compatible", "m"), ask(WebSearch()))
    assert not info.value.retryable and "no search tool" in info.value.message
    assert server.calls() == 0


# ------------------------------------------------------------------------- the Responses path
# The same failure classification as the chat path: the SDK exceptions are shared.


async def openai_search_failure(server: AgentServer, **fields: Any) -> AgentCallError:
    with pytest.raises(AgentCallError) as info:
        await complete(spec_for(server, "openai", **fields), ask(WebSearch()))
    assert server.requests("m")[0].path == "/v1/responses"
    return info.value


async def test_responses_429_is_retryable_with_retry_after(server: AgentServer) -> None:
    server.script("m", [Reply.error(429, "slow down", retry_after=2)])
    err = await openai_search_failure(server)
    assert err.retryable and err.kind == E.RATE_LIMITED and err.retry_after == 2.0
    assert server.calls("m") == 1  # the SDK's retries are off


async def test_responses_5xx_is_retryable(server: AgentServer) -> None:
    server.script("m", [Reply.error(503, "overloaded")])
    err = await openai_search_failure(server)
    assert err.retryable and err.status == 503 and server.calls("m") == 1


@pytest.mark.parametrize("kind", ["json", "fields"])
async def test_responses_malformed_body_is_retryable(server: AgentServer, kind: Any) -> None:
    server.script("m", [Reply.malformed(kind)])
    err = await openai_search_failure(server)
    assert err.retryable and err.kind == E.MALFORMED


async def test_responses_401_hides_the_key(server: AgentServer) -> None:
    server.script("m", [Reply.error(401, f"bad key {KEY}")])
    err = await openai_search_failure(server)
    assert not err.retryable and err.kind == E.AUTH_FAILED and KEY not in err.message


async def test_responses_refusal_and_length(server: AgentServer) -> None:
    server.script("m", [Reply.refusal()])
    err = await openai_search_failure(server)
    assert not err.retryable and err.kind == E.REFUSED
    server.script("m", [Reply.ok("cut sho", finish_reason="length")])
    done = await complete(spec_for(server, "openai"), ask(WebSearch()))
    assert (done.text, done.finish_reason) == ("cut sho", "length")


async def test_responses_hung_agent_times_out(server: AgentServer) -> None:
    server.script("m", [Reply.ok("late").after(3)])
    err = await openai_search_failure(server, timeout_s=0.3)
    assert err.retryable and err.kind == E.TIMEOUT


# ------------------------------------------------------------------------- the pool


def write_pool(tmp_path: Path, agent: str, conductor: str = 'provider = "local"\n') -> Path:
    path = tmp_path / "pool.toml"
    path.write_text(
        f'[conductor]\nid = "c"\nmodel = "x"\n{conductor}\n[[agents]]\nid = "a"\n{agent}'
    )
    return path


@pytest.mark.parametrize(
    ("agent", "expected"),
    [
        ('provider = "openai"\nmodel = "gpt-5"\nweb_search = true\n', WebSearch()),
        (
            'provider = "anthropic"\nmodel = "c"\n[agents.web_search]\nmax_uses = 3\n'
            'allowed_domains = ["arxiv.org"]\n',
            WebSearch(max_uses=3, allowed_domains=["arxiv.org"]),
        ),
        ('provider = "google"\nmodel = "g"\nweb_search = { enabled = true }\n', WebSearch()),
        ('provider = "openai"\nmodel = "gpt-5"\n', None),
    ],
)
def test_pool_reads_web_search(tmp_path: Path, agent: str, expected: WebSearch | None) -> None:
    spec = Pool.load(write_pool(tmp_path, agent)).get("a")
    assert spec.web_search == expected
    assert spec.searches_web is (expected is not None)


@pytest.mark.parametrize(
    ("agent", "message"),
    [
        (
            'provider = "openai-compatible"\nmodel = "q"\nbase_url = "http://x/v1"\n'
            "web_search = true\n",
            "agent 'a': web_search needs a provider with its own search tool (openai, "
            "anthropic or google), not openai-compatible",
        ),
        (
            'provider = "local"\nmodel = "q"\nweb_search = { max_uses = 2 }\n',
            "not local",
        ),
        (
            'provider = "google"\nmodel = "g"\nweb_search = { allowed_domains = ["a.org"] }\n',
            "agent 'a': google web search does not support allowed_domains",
        ),
        (
            'provider = "openai"\nmodel = "g"\nweb_search = { blocked_domains = ["a.org"] }\n',
            "agent 'a': openai web search does not support blocked_domains",
        ),
        (
            'provider = "anthropic"\nmodel = "c"\n'
            'web_search = { allowed_domains = ["a.org"], blocked_domains = ["b.org"] }\n',
            "allowed_domains or blocked_domains, not both",
        ),
        (
            'provider = "openai"\nmodel = "g"\nweb_search = { max_uses = 0 }\n',
            "agents.0.web_search.max_uses",
        ),
    ],
)
def test_pool_rejects_web_search_it_cannot_honour(
    tmp_path: Path, agent: str, message: str
) -> None:
    with pytest.raises(PoolError, match="invalid at agents.0") as info:
        Pool.load(write_pool(tmp_path, agent))
    assert message in str(info.value)


def test_disabled_web_search_is_allowed_anywhere(tmp_path: Path) -> None:
    agent = 'provider = "local"\nmodel = "q"\nweb_search = false\n'
    assert not Pool.load(write_pool(tmp_path, agent)).get("a").searches_web


def test_conductor_may_not_search(tmp_path: Path) -> None:
    conductor = 'provider = "openai"\nweb_search = true\n'
    path = write_pool(tmp_path, 'provider = "local"\nmodel = "q"\n', conductor)
    with pytest.raises(PoolError, match="give web_search to agents instead"):
        Pool.load(path)


def test_shipped_deep_research_pool_and_tasks_load() -> None:
    pool = Pool.load(EXAMPLES / "pool.toml")
    searching = [a for a in pool.agents if a.searches_web]
    assert {a.provider for a in searching} == {"openai", "anthropic", "google"}
    assert any(not a.searches_web for a in pool.agents)  # a writer that works from the steps
    assert all(a.api_key_env and a.api_key_env.endswith("_API_KEY") for a in pool.agents)
    assert all(a.price_output_per_mtok > 0 for a in [pool.conductor, *pool.agents])

    tasks = load_jsonl(EXAMPLES / "tasks.jsonl")
    assert tasks.errors == []
    assert 8 <= len(tasks.tasks) <= 12
    assert len({t.id for t in tasks.tasks}) == len(tasks.tasks)
    assert all(t.dataset == "deep-research" and t.tags for t in tasks.tasks)


# ------------------------------------------------------------------------- the agent activity


def activities_for(server: AgentServer, provider: str, search: WebSearch | None) -> AgentActivities:
    conductor = AgentSpec(id="conductor", provider="local", model="x")
    agent = spec_for(server, provider, id="researcher", web_search=search, timeout_s=60.0)
    return AgentActivities(Pool(conductor=conductor, agents=[agent]))


def step() -> AgentCallInput:
    return AgentCallInput(agent="researcher", question="When?", subtask="Find the year.")


def environment(heartbeat_timeout_s: float | None = None) -> ActivityEnvironment:
    env = ActivityEnvironment()
    timeout = timedelta(seconds=heartbeat_timeout_s) if heartbeat_timeout_s else None
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timeout)
    return env


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_activity_returns_citations_of_a_searching_agent(
    server: AgentServer, provider: str
) -> None:
    server.script("m", [Reply.ok("2012", citations=SOURCES)])
    acts = activities_for(server, provider, WebSearch())

    reply = await environment().run(acts.call_agent, step())

    assert server.requests("m")[0].web_search
    expected = (
        [c.model_copy(update={"snippet": None}) for c in SOURCES]
        if provider == "openai"
        else SOURCES
    )
    assert (reply.output, reply.citations) == ("2012", expected)
    # The citations survive the data converter's round trip into a step record.
    record = StepRecord(
        round=0, index=0, agent="researcher", subtask="s", access=[],
        citations=AgentReply.model_validate_json(reply.model_dump_json()).citations,
    )
    assert record.citations == reply.citations


async def test_activity_without_web_search_sends_no_tool(server: AgentServer) -> None:
    acts = activities_for(server, "anthropic", WebSearch(enabled=False))
    reply = await environment().run(acts.call_agent, step())
    assert reply.citations == []
    assert not server.requests("m")[0].web_search


async def test_activity_heartbeats_while_the_agent_works(server: AgentServer) -> None:
    server.script("m", [Reply.ok("done").after(1.5)])
    env = environment(heartbeat_timeout_s=3)  # a beat every second
    beats: list[float] = []
    env.on_heartbeat = lambda *_: beats.append(time.monotonic())

    reply = await env.run(activities_for(server, "openai", None).call_agent, step())

    assert reply.output == "done"
    assert len(beats) == 2  # at the start and a second later; none after the answer
    await asyncio.sleep(1.2)
    assert len(beats) == 2


async def test_activity_without_heartbeat_timeout_does_not_beat(server: AgentServer) -> None:
    env = environment()
    beats: list[object] = []
    env.on_heartbeat = lambda *args: beats.append(args)
    await env.run(activities_for(server, "openai", None).call_agent, step())
    assert beats == []


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_cancellation_through_heartbeats_abandons_the_call(
    server: AgentServer, provider: str
) -> None:
    """Temporal answers a heartbeat with "cancel requested" and the SDK cancels the activity's
    task: the in-flight HTTP request must be dropped at once, not waited out."""
    server.script("m", [Reply.ok("never").after(30)])
    env = environment(heartbeat_timeout_s=3)
    beats: list[float] = []

    def on_heartbeat(*_: object) -> None:
        beats.append(time.monotonic())
        if len(beats) == 2:  # the call is in flight by the second beat
            env.cancel()

    env.on_heartbeat = on_heartbeat
    started = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await env.run(activities_for(server, provider, WebSearch()).call_agent, step())

    assert time.monotonic() - started < 15, "dropped, not waited out (the reply comes at 30 s)"
    (seen,) = server.requests("m")
    deadline = time.monotonic() + 2.0
    while not seen.hung_up and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert seen.hung_up, "the agent's HTTP request was still open after the cancellation"


def test_summary_for_the_pool_listing() -> None:
    assert WebSearch().summary() == "on"
    assert WebSearch(enabled=False).summary() == "off"
    search = WebSearch(
        max_uses=5, allowed_domains=["arxiv.org"], user_location=UserLocation(city="Oslo")
    )
    assert search.summary() == "on (max 5; only arxiv.org; from Oslo)"
