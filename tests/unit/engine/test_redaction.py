"""No secret in what the engine writes down: URLs, key-shaped strings and the environment's
secrets are masked in messages, failures (the history) and pool files refuse keys."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from temporalio.exceptions import ApplicationError

from conductor_engine.engine.providers.base import AgentCallError
from conductor_engine.engine.providers.pool import AgentSpec
from conductor_engine.engine.redaction import looks_like_key, redact_text, redact_url
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.payloads import data_converter

# Shaped like real keys, made up (the same shapes the providers document).
KEYS = [
    "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv",
    "sk-ant-api03-Ab3dEf6hIj9kLm2nOp5qRs8tUv",
    "AIzaSyAb3dEf6hIj9kLm2nOp5qRs8tUvWxYz0123",
    "hf_Ab3dEf6hIj9kLm2nOp5qRs8tUvWxYz",
    "gsk_Ab3dEf6hIj9kLm2nOp5qRs8tUvWxYz",
    "ghp_Ab3dEf6hIj9kLm2nOp5qRs8tUvWxYz",
    "AKIAIOSFODNN7EXAMPLE",
    "xai-Ab3dEf6hIj9kLm2nOp5qRs8tUvWxYz",
]


@pytest.mark.parametrize(("url", "shown"), [
    ("https://alice:hunter2@proxy.example/v1", "https://alice:***@proxy.example/v1"),
    ("https://sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv@api.example/v1", "https://***@api.example/v1"),
    ("https://gen.example/v1?key=AIzaSyAb3dEf6&alt=sse", "https://gen.example/v1?key=***&alt=sse"),
    ("https://b.s3.example/o?X-Amz-Credential=AK%2F1&X-Amz-Signature=abc123&X-Amz-Expires=60",
     "https://b.s3.example/o?X-Amz-Credential=***&X-Amz-Signature=***&X-Amz-Expires=60"),
    ("postgres://u@db/c?sslmode=require&password=s3cret&sslpassword=s3cret",
     "postgres://u@db/c?sslmode=require&password=***&sslpassword=***"),
    ("http://127.0.0.1:8000/v1?access_token=s3cret", "http://127.0.0.1:8000/v1?access_token=***"),
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
    ("https://api.example/v1?model=gpt&n=2", "https://api.example/v1?model=gpt&n=2"),
])
def test_urls_lose_their_credentials_and_keep_the_rest(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize("key", KEYS)
def test_key_shaped_strings_are_masked_wherever_they_appear(key: str) -> None:
    assert looks_like_key(key)
    text = redact_text(f"the server said: invalid key {key} (check it)")
    assert key not in text and "***" in text and "(check it)" in text


def test_text_loses_urls_passwords_bearer_tokens_and_given_secrets() -> None:
    text = ("connect to postgresql://conductor@db:5432/c?password=hunter2 failed; "
            "dsn host=db password='two words' dbname=c; Authorization: Bearer abc.def-123456; "
            "echo of my-own-secret-value here")
    out = redact_text(text, ["my-own-secret-value"])
    for secret in ("hunter2", "two words", "abc.def-123456", "my-own-secret-value"):
        assert secret not in out
    assert "postgresql://conductor@db:5432/c" in out and "dbname=c" in out


def test_the_environment_s_secrets_are_masked_by_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACME_SERVICE_TOKEN", "plain-looking-value-42")
    monkeypatch.setenv("CONDUCTOR_DATABASE_URL", "postgresql://u:pg-pass-77@db/c")
    monkeypatch.setenv("HARMLESS_SETTING", "plain-looking-words")
    out = redact_text("got plain-looking-value-42 and pg-pass-77, kept plain-looking-words")
    assert "plain-looking-value-42" not in out and "pg-pass-77" not in out
    assert "plain-looking-words" in out


def test_each_entry_of_a_comma_separated_key_list_is_masked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`CONDUCTOR_API_KEYS=k1,k2`: a log line quoting one key must not show it."""
    monkeypatch.setenv("CONDUCTOR_API_KEYS", "serve-key-one-1234, serve-key-two-5678")
    out = redact_text("401 for serve-key-two-5678; then serve-key-one-1234 worked")
    assert "serve-key-two-5678" not in out and "serve-key-one-1234" not in out
    assert out == "401 for ***; then *** worked"


@pytest.mark.parametrize("text", [
    '{"api_key": "plainvalue", "model": "gpt"}',
    '{"headers": {"x-api-key": "plainvalue"}, "model": "gpt"}',
    "{'password': 'plainvalue', 'model': 'gpt'}",
    '{"client_secret": "plain\\"value", "model": "gpt"}',
], ids=["json", "nested-json", "python-repr", "escaped-quote"])
def test_key_like_json_fields_lose_their_values_whatever_they_look_like(text: str) -> None:
    out = redact_text(text)
    assert "plain" not in out and "value" not in out, out
    assert "***" in out and "gpt" in out


@pytest.mark.parametrize(("text", "shown"), [
    ("x-api-key: plainvalue\nhost: api.example", "x-api-key: ***\nhost: api.example"),
    ("X-Goog-Api-Key:plainvalue", "X-Goog-Api-Key:***"),
    ("Authorization: Basic dXNlcjpwbGFpbnZhbHVl", "Authorization: Basic ***"),
    ("Authorization: Token plainvalue", "Authorization: Token ***"),
    ('Authorization: Digest username="u", response="plainvalue"\r\nHost: h',
     "Authorization: Digest ***\r\nHost: h"),
    ("Proxy-Authorization: Basic dXNlcjpwbGFpbnZhbHVl", "Proxy-Authorization: Basic ***"),
    ("authorization=plainvalue", "authorization=***"),
], ids=["x-api-key", "no-space", "basic", "token", "digest", "proxy", "equals"])
def test_auth_headers_of_every_scheme_and_secret_named_headers_are_masked(
    text: str, shown: str,
) -> None:
    assert redact_text(text) == shown


def test_a_basic_credential_is_masked_wherever_it_stands_and_basic_words_stay() -> None:
    """`Basic` + base64 of `user:password`, in prose or a repr; the English word stays."""
    assert redact_text("sent Basic dXNlcjpwbGFpbnZhbHVl to it") == "sent Basic *** to it"
    prose = "basic arithmetic is basic; Basic Authentication; step: 3; model: gpt-4"
    assert redact_text(prose) == prose


def test_an_agent_error_is_redacted_however_it_was_built() -> None:
    error = AgentCallError(
        "agent gpt: could not reach https://u:hunter2@proxy.example/v1?api_key=zz9 (said "
        f"{KEYS[0]})", retryable=True)
    assert "hunter2" not in error.message and "zz9" not in error.message
    assert KEYS[0] not in str(error)


def test_failures_written_to_history_carry_no_secret_in_any_cause(tmp_path) -> None:
    """The data converter's failure converter is the last pass before history: an error from
    a library the engine does not control, chained under one of ours, loses its secrets too."""
    converter = data_converter(Settings(data_dir=tmp_path))
    try:
        try:
            raise ConnectionError("could not connect to postgresql://app:hunter2@db/c?sslpassword"
                                  f"=tls-secret with key {KEYS[2]}")
        except ConnectionError as e:
            raise ApplicationError("TraceStoreUnavailable: see cause") from e
    except ApplicationError as e:
        failure = converter.failure_converter
        from temporalio.api.failure.v1 import Failure

        proto = Failure()
        failure.to_failure(e, converter.payload_converter, proto)
    written = proto.SerializeToString()
    for secret in (b"hunter2", b"tls-secret", KEYS[2].encode()):
        assert secret not in written
    assert b"postgresql://app:***@db/c" in written


@pytest.mark.parametrize("value", [*KEYS, "openai_api_key", "my-key", "OPENAI API KEY", "1KEY"])
def test_api_key_env_refuses_anything_but_a_variable_name(value: str) -> None:
    with pytest.raises(ValidationError) as caught:
        AgentSpec(id="a", provider="openai", model="m", api_key_env=value)
    assert value not in str(caught.value), "the refusal must not repeat what may be a key"
    assert "NAME of an environment variable" in str(caught.value)


@pytest.mark.parametrize("name", ["OPENAI_API_KEY", "K", "_PRIVATE_KEY_2"])
def test_api_key_env_accepts_variable_names(name: str) -> None:
    assert AgentSpec(id="a", provider="openai", model="m", api_key_env=name).api_key_env == name


def test_a_pool_with_a_key_in_it_is_refused_without_repeating_the_key() -> None:
    from conductor_engine.engine.providers.pool import Pool

    with pytest.raises(ValidationError) as caught:
        Pool.model_validate({
            "conductor": {"id": "c", "provider": "openai", "model": "m", "api_key_env": KEYS[3]},
            "agents": [{"id": "a", "provider": "google", "model": "m", "api_key_env": KEYS[2]}]})
    assert KEYS[3] not in str(caught.value) and KEYS[2] not in str(caught.value)
    assert 'api_key_env = "GOOGLE_API_KEY"' in str(caught.value)
