"""The HTTP attacks of the second adversarial review on `conductor serve`: the app on uvicorn (a
real HTTP server on a free port) in front of the real Temporal dev server, with a worker whose
agents are the scripted agent server. Each attack is refused with OpenAI's JSON error body and
the right status, starts no workflow, and an oversized body is refused before it is read whole
(docs/reference/limits.md lists every bound).

Before: a 30 MB message started a workflow that stayed Running forever and took the server from
126 MB to 1.2 GB; a body nested 100k levels, a number of 4,300+ digits and
`GET /v1/models/conductor@v<5000 digits>` were plain-text 500s.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from temporalio.client import Client

from conductor_engine.engine.contracts.limits import MAX_JSON_REQUEST_BYTES
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.trace_store import TraceStore
from conductor_engine.runtime.client import ConductorClient
from tests.conftest import make_pool, running_worker
from tests.integration.test_serve import serving

KEY = "sk-http-attack-key"
MB = 1024 * 1024
AUTH = {"authorization": f"Bearer {KEY}"}
ATTACKS_RUN: list[str] = []


@pytest.fixture
async def served(agent_server: Any, conductor: ConductorClient, client: Client,
                 settings: Settings, trace_store: TraceStore) -> AsyncIterator[str]:
    async with running_worker(client, settings, make_pool(agent_server)), \
            serving(conductor, trace_store, [KEY]) as base_url:
        yield base_url


def _chat(content: Any, **extra: Any) -> dict[str, Any]:
    return {"model": "conductor", "messages": [{"role": "user", "content": content}], **extra}


async def _no_workflow_started(client: Client, settings: Settings) -> None:
    started = [wf.id async for wf in client.list_workflows(
        f'TaskQueue = "{settings.task_queue}"')]
    assert started == [], f"the attack started {started}"


def _refused(response: httpx.Response, status: int, code: str | None = None) -> str:
    """The response is `status` with OpenAI's error body (JSON, never plain text); its message."""
    assert response.status_code == status, response.text[:500]
    assert response.headers["content-type"].startswith("application/json"), response.text[:200]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] in ("invalid_request_error", "not_found_error")
    if code is not None:
        assert error["code"] == code, error
    assert len(error["message"]) < 600 and "\n" not in error["message"]
    return str(error["message"])


async def _raw_exchange(base_url: str, head: str, body_chunks: AsyncIterator[bytes]
                        ) -> tuple[int, dict[str, Any], int]:
    """Send `head`, then the body chunks until the server answers or hangs up: (status, JSON
    body, bytes of body sent). The answer is read while sending, as a client that cares would."""
    url = urlsplit(base_url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    writer.write(head.encode())
    sent = 0
    answer = asyncio.ensure_future(reader.read(1 << 16))
    try:
        async for chunk in body_chunks:
            if answer.done():
                break
            try:
                writer.write(chunk)
                await writer.drain()
            except ConnectionError:
                break
            sent += len(chunk)
        raw = await asyncio.wait_for(answer, 30)
        while b"\r\n\r\n" not in raw or len(raw.partition(b"\r\n\r\n")[2]) < _length(raw):
            more = await asyncio.wait_for(reader.read(1 << 16), 30)
            if not more:
                break
            raw += more
    finally:
        answer.cancel()
        writer.close()
    head_bytes, _, body = raw.partition(b"\r\n\r\n")
    status = int(head_bytes.split()[1])
    return status, json.loads(body[:_length(raw)]), sent


def _length(raw: bytes) -> int:
    for line in raw.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


async def test_a_30mb_message_is_a_413_and_starts_no_workflow(
    served: str, client: Client, settings: Settings,
) -> None:
    ATTACKS_RUN.append("30 MB message")
    async with httpx.AsyncClient(timeout=60) as http:
        response = await http.post(f"{served}/chat/completions", headers=AUTH,
                                   json=_chat("x" * (30 * MB)))
    message = _refused(response, 413, "request_too_large")
    assert "8,388,608 bytes (8.0 MiB)" in message and "shorten the messages" in message
    await _no_workflow_started(client, settings)


async def test_a_conversation_over_the_task_bound_is_a_413_and_starts_no_workflow(
    served: str, client: Client, settings: Settings,
) -> None:
    """Under the body bound, over the task bound (two messages of 600 KB): refused as the task
    it would become, before the run starts."""
    ATTACKS_RUN.append("conversation over MAX_TASK_BYTES")
    body = {"model": "conductor", "messages": [{"role": "system", "content": "s" * 600_000},
                                               {"role": "user", "content": "u" * 600_000}]}
    async with httpx.AsyncClient(timeout=60) as http:
        response = await http.post(f"{served}/chat/completions", headers=AUTH, json=body)
    message = _refused(response, 413, "conversation_too_large")
    assert message.startswith("this conversation is 1,20") and "shorten the messages" in message
    assert response.json()["error"]["param"] == "messages"
    await _no_workflow_started(client, settings)


async def test_a_declared_30mb_body_is_refused_before_a_byte_of_it_is_read(served: str) -> None:
    """Content-Length over the bound: the answer comes with none of the body sent."""
    ATTACKS_RUN.append("Content-Length 30 MB")
    url = urlsplit(served)

    async def nothing() -> AsyncIterator[bytes]:
        return
        yield b""

    head = (f"POST {url.path}/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {30 * MB}\r\n\r\n")
    started = time.monotonic()
    status, body, sent = await _raw_exchange(served, head, nothing())
    assert status == 413 and body["error"]["code"] == "request_too_large"
    assert sent == 0 and time.monotonic() - started < 30


async def test_a_streamed_30mb_body_is_refused_once_it_passes_the_bound(served: str) -> None:
    """Chunked, with no Content-Length: the server stops reading just past the bound and
    answers 413; most of the 30 MB is never sent (socket buffers hold a few MB at most)."""
    ATTACKS_RUN.append("chunked 30 MB body")
    url = urlsplit(served)
    piece = 256 * 1024

    async def chunks() -> AsyncIterator[bytes]:
        start = b'{"model": "conductor", "messages": [{"role": "user", "content": "'
        yield b"%x\r\n%s\r\n" % (len(start), start)
        for _ in range(30 * MB // piece):
            yield b"%x\r\n%s\r\n" % (piece, b"x" * piece)

    head = (f"POST {url.path}/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n")
    status, body, sent = await _raw_exchange(served, head, chunks())
    assert status == 413 and body["error"]["code"] == "request_too_large"
    assert MAX_JSON_REQUEST_BYTES < sent < 20 * MB, sent


@pytest.mark.parametrize("depth", [1_000, 100_000])
async def test_a_body_nested_deeply_is_a_400(served: str, depth: int) -> None:
    ATTACKS_RUN.append(f"nested {depth} levels")
    deep = "[" * depth + "]" * depth
    payloads = [  # in a field the server ignores, in a content part, and as the whole body
        f'{{"model": "conductor", "messages": [{{"role": "user", "content": "hi"}}], '
        f'"x": {deep}}}',
        f'{{"model": "conductor", "messages": [{{"role": "user", "content": [{{"type": "text",'
        f' "text": "hi", "more": {deep}}}]}}]}}',
        deep]
    async with httpx.AsyncClient(timeout=60) as http:
        for payload in payloads:
            response = await http.post(f"{served}/chat/completions", content=payload,
                                       headers={**AUTH, "content-type": "application/json"})
            assert "recursion limit" in _refused(response, 400)


@pytest.mark.parametrize("where", ["temperature", "ignored"])
async def test_a_number_of_5000_digits_is_a_400(served: str, where: str) -> None:
    ATTACKS_RUN.append(f"5,000-digit number ({where})")
    number = "9" * 5000
    payload = (f'{{"model": "conductor", "messages": [{{"role": "user", "content": "hi"}}], '
               f'"{"temperature" if where == "temperature" else "seed"}": {number}}}')
    async with httpx.AsyncClient(timeout=60) as http:
        response = await http.post(f"{served}/chat/completions", content=payload,
                                   headers={**AUTH, "content-type": "application/json"})
    assert "number out of range" in _refused(response, 400)


async def test_a_model_name_of_5000_digits_is_a_json_404_or_400(served: str) -> None:
    ATTACKS_RUN.append("5,000-digit model version")
    name = "conductor@v" + "9" * 5000
    async with httpx.AsyncClient(timeout=60) as http:
        got = await http.get(f"{served}/models/{name}", headers=AUTH)
        message = _refused(got, 404, "model_not_found")
        assert "at most 256 characters" in message and "9" * 100 not in message
        for version in ("v" + "9" * 10, "v١٢"):  # past 9 digits; digits of another script
            got = await http.get(f"{served}/models/conductor@{version}", headers=AUTH)
            _refused(got, 404, "model_not_found")
        posted = await http.post(f"{served}/chat/completions", headers=AUTH,
                                 json={**_chat("hi"), "model": name})
        assert _refused(posted, 400).startswith("model: String should have at most 256")


async def test_a_non_text_content_part_and_a_non_string_text_are_400s(served: str) -> None:
    ATTACKS_RUN.append("non-text parts")
    async with httpx.AsyncClient(timeout=60) as http:
        image = await http.post(f"{served}/chat/completions", headers=AUTH, json=_chat(
            [{"type": "image_url", "image_url": {"url": "http://example.invalid/x.png"}}]))
        assert "reads text only" in _refused(image, 400)
        nested = await http.post(f"{served}/chat/completions", headers=AUTH, json=_chat(
            [{"type": "text", "text": [[["deep"]]]}]))
        _refused(nested, 400)


def test_every_http_attack_ran() -> None:
    """The count the closing note reports (run last in this module)."""
    print(f"\nHTTP attacks run: {len(ATTACKS_RUN)}: {', '.join(ATTACKS_RUN)}")
