"""The three providers through their real SDKs, against the scripted agent server.

Each failure mode must come out as an AgentCallError classified the way Temporal needs it
(retryable or not, Retry-After), with a message a person can act on, after exactly one HTTP
request: the SDKs' own retries must be off.
"""

from __future__ import annotations

import time

import pytest

from conductor_engine.engine.providers import AgentCallError, CompletionRequest, Message, complete
from conductor_engine.engine.providers import errors as E
from conductor_engine.engine.providers.pool import AgentSpec
from tests.agent_server import AgentServer, Reply

PROVIDERS = ["openai", "anthropic", "google"]
KEY_ENV = "CONDUCTOR_TEST_AGENT_KEY"
KEY = "sk-test-not-a-real-key-0123456789"
SCHEMA = {"type": "object", "properties": {"steps": {"type": "array"}}, "required": ["steps"]}


@pytest.fixture
def server(agent_server: AgentServer, monkeypatch: pytest.MonkeyPatch) -> AgentServer:
    agent_server.reset()
    monkeypatch.setenv(KEY_ENV, KEY)
    return agent_server


def spec_for(server: AgentServer, provider: str, model: str = "m", **fields: object) -> AgentSpec:
    values: dict[str, object] = {"api_key_env": KEY_ENV, "timeout_s": 5.0}
    values.update(fields)
    return server.spec(provider, model, **values)


def ask(text: str = "What is 6 x 7?", **fields: object) -> CompletionRequest:
    return CompletionRequest(
        messages=[
            Message(role="system", content="You are terse."),
            Message(role="user", content=text),
        ],
        **fields,  # type: ignore[arg-type]
    )


async def failure(spec: AgentSpec, request: CompletionRequest | None = None) -> AgentCallError:
    with pytest.raises(AgentCallError) as info:
        await complete(spec, request or ask())
    return info.value


# ------------------------------------------------------------------------- success


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_plain_completion_returns_text_usage_and_cost(
    server: AgentServer, provider: str
) -> None:
    server.script("m", [Reply.ok("42", input_tokens=11, output_tokens=3)])
    spec = spec_for(server, provider, price_input_per_mtok=1.0, price_output_per_mtok=10.0)

    done = await complete(spec, ask(temperature=0.3))

    assert done.text == "42"
    assert (done.usage.input_tokens, done.usage.output_tokens) == (11, 3)
    assert done.cost_usd == pytest.approx((11 * 1.0 + 3 * 10.0) / 1e6)
    assert done.finish_reason == "stop"
    (seen,) = server.requests("m")
    assert seen.api_key == KEY
    assert seen.temperature == pytest.approx(0.3)
    assert seen.system == "You are terse."
    assert seen.messages[-1] == {"role": "user", "content": "What is 6 x 7?"}


async def test_anthropic_gets_system_prompt_outside_messages(server: AgentServer) -> None:
    await complete(spec_for(server, "anthropic"), ask())
    (seen,) = server.requests("m")
    assert seen.body["system"] == "You are terse."
    assert [m["role"] for m in seen.body["messages"]] == ["user"]


async def test_responder_answers_from_the_prompt(server: AgentServer) -> None:
    server.set_responder("m", lambda text: "yes" if "6 x 7" in text else "no")
    for provider in PROVIDERS:
        assert (await complete(spec_for(server, provider), ask())).text == "yes"
    assert server.calls("m") == 3


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_length_stop_is_reported(server: AgentServer, provider: str) -> None:
    server.script("m", [Reply.ok("cut sho", finish_reason="length")])
    done = await complete(spec_for(server, provider), ask())
    assert (done.text, done.finish_reason) == ("cut sho", "length")


# ------------------------------------------------------------------------- structured output


@pytest.mark.parametrize(
    ("provider", "constrained"), [("openai", True), ("google", True), ("anthropic", False)]
)
async def test_json_schema_is_requested_where_supported(
    server: AgentServer, provider: str, constrained: bool
) -> None:
    await complete(spec_for(server, provider), ask(json_schema=SCHEMA, schema_name="plan"))
    (seen,) = server.requests("m")
    assert seen.wants_json is constrained
    assert seen.json_schema == (SCHEMA if constrained else None)


async def test_openai_sends_response_format_json_schema(server: AgentServer) -> None:
    await complete(spec_for(server, "openai"), ask(json_schema=SCHEMA, schema_name="plan"))
    fmt = server.requests("m")[0].body["response_format"]
    assert fmt == {
        "type": "json_schema",
        "json_schema": {"name": "plan", "schema": SCHEMA, "strict": False},
    }


async def test_structured_output_off_sends_no_schema(server: AgentServer) -> None:
    spec = spec_for(server, "openai", structured_output=False)
    await complete(spec, ask(json_schema=SCHEMA))
    assert "response_format" not in server.requests("m")[0].body


# ------------------------------------------------------------------------- vLLM


async def test_openai_compatible_returns_token_ids_and_logprobs(server: AgentServer) -> None:
    server.script("qwen", [Reply.ok("hi there", token_ids=[17, 42], logprobs=[-0.1, -2.5])])
    spec = server.spec("openai-compatible", "qwen", id="vllm")  # no key: a local server

    done = await complete(spec, ask())

    assert done.text == "hi there"
    assert done.token_ids == [17, 42]
    assert done.logprobs == pytest.approx([-0.1, -2.5])
    (seen,) = server.requests("qwen")
    assert seen.api_key == E.PLACEHOLDER_KEY
    assert seen.logprobs is True
    assert seen.body["return_tokens_as_token_ids"] is True
    assert seen.body["max_tokens"] == 1024


async def test_openai_compatible_without_token_data_still_answers(server: AgentServer) -> None:
    done = await complete(server.spec("openai-compatible", "qwen"), ask())
    assert (done.text, done.token_ids, done.logprobs) == ("ok", None, None)


async def test_openai_uses_max_completion_tokens_and_no_logprobs(server: AgentServer) -> None:
    await complete(spec_for(server, "openai"), ask(max_tokens=77))
    body = server.requests("m")[0].body
    assert body["max_completion_tokens"] == 77
    assert "max_tokens" not in body and "logprobs" not in body


# ------------------------------------------------------------------------- retryable failures


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_429_is_retryable_with_retry_after(server: AgentServer, provider: str) -> None:
    server.script("m", [Reply.error(429, "slow down", retry_after=1)])
    err = await failure(spec_for(server, provider))
    assert err.retryable and err.status == 429 and err.kind == E.RATE_LIMITED
    assert err.retry_after == 1.0
    assert "slow down" in err.message
    assert server.calls("m") == 1


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_500_is_retryable_after_exactly_one_call(server: AgentServer, provider: str) -> None:
    server.script("m", [Reply.error(500, "boom")])
    err = await failure(spec_for(server, provider))
    assert err.retryable and err.status == 500 and err.retry_after is None
    assert f"agent {provider}-m" in err.message
    assert server.calls("m") == 1  # no SDK retries


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_malformed_json_body_is_retryable(server: AgentServer, provider: str) -> None:
    server.script("m", [Reply.malformed("json")])
    err = await failure(spec_for(server, provider))
    assert err.retryable and err.kind == E.MALFORMED
    assert "malformed response" in err.message
    assert server.calls("m") == 1


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_body_missing_fields_is_retryable(server: AgentServer, provider: str) -> None:
    server.script("m", [Reply.malformed("fields")])
    err = await failure(spec_for(server, provider))
    assert err.retryable and err.kind == E.MALFORMED
    assert "malformed response" in err.message


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_hung_agent_times_out_retryably(server: AgentServer, provider: str) -> None:
    server.script("m", [Reply.ok("too late").after(3)])
    spec = spec_for(server, provider, timeout_s=0.3)
    started = time.monotonic()
    err = await failure(spec)
    # the kind proves the timeout fired (the reply would have come at 3 s); the bound is a net
    assert time.monotonic() - started < 30
    assert err.retryable and err.kind == E.TIMEOUT
    assert "timeout_s=0.3" in err.message
    assert server.calls("m") == 1


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_unreachable_server_is_retryable(server: AgentServer, provider: str) -> None:
    spec = spec_for(server, provider, base_url="http://127.0.0.1:9")  # discard port: refused
    if provider == "openai":
        spec = spec.model_copy(update={"base_url": "http://127.0.0.1:9/v1"})
    err = await failure(spec)
    assert err.retryable and err.kind == E.CONNECTION


# ------------------------------------------------------------------------- non-retryable failures


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_401_names_the_env_var_and_hides_the_key(server: AgentServer, provider: str) -> None:
    server.script("m", [Reply.error(401, f"Incorrect API key provided: {KEY}")])
    err = await failure(spec_for(server, provider))
    assert not err.retryable and err.status == 401 and err.kind == E.AUTH_FAILED
    assert f"set the environment variable {KEY_ENV} to a valid key" in err.message
    assert KEY not in err.message and KEY not in str(err)
    assert err.__cause__ is None  # the SDK's error, which quotes the server, is not chained


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_400_is_a_bad_request(server: AgentServer, provider: str) -> None:
    server.script("m", [Reply.error(400, "temperature must be at most 2")])
    err = await failure(spec_for(server, provider))
    assert not err.retryable and err.status == 400 and err.kind == E.BAD_REQUEST
    assert "bad request" in err.message and "temperature must be at most 2" in err.message
    assert f"agent {provider}-m" in err.message
    assert server.calls("m") == 1


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_404_points_at_the_model_name(server: AgentServer, provider: str) -> None:
    server.script("m", [Reply.error(404, "model not found")])
    err = await failure(spec_for(server, provider))
    assert not err.retryable and err.status == 404
    assert "check the model name 'm'" in err.message


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_missing_key_env_names_the_variable(
    server: AgentServer, provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV)
    err = await failure(spec_for(server, provider))
    assert not err.retryable and err.kind == E.KEY_MISSING
    assert KEY_ENV in err.message
    assert server.calls() == 0


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_refusal_is_not_retryable(server: AgentServer, provider: str) -> None:
    server.script("m", [Reply.refusal()])
    err = await failure(spec_for(server, provider))
    assert not err.retryable and err.kind == E.REFUSED
    assert "refused" in err.message


# ------------------------------------------------------------------------- the server itself


async def test_script_repeats_its_last_reply_then_resets(server: AgentServer) -> None:
    spec = spec_for(server, "openai", model="x")
    server.script("x", ["a", Reply.ok("b")])
    replies = [(await complete(spec, ask())).text for _ in range(4)]
    assert replies == ["a", "b", "b", "b"]
    assert server.calls("x") == 4 and server.calls() == 4
    server.reset()
    assert server.calls("x") == 0 and server.requests() == []
    assert (await complete(spec, ask())).text == "ok"  # the default reply
