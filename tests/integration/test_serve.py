"""`conductor serve` as an OpenAI client sees it: the official `openai` package against the app
on uvicorn (a real HTTP server on a free port), each request one ConductWorkflow on the real
Temporal dev server, served by a worker whose agents are the scripted agent server."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn
from temporalio.client import Client, WorkflowExecutionStatus

from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.policies import PolicyRegistry
from conductor_engine.engine.storage.trace_store import TraceStore
from conductor_engine.runtime.client import ConductorClient, RunFailed
from conductor_engine.runtime.serve.access import API_KEYS_ENV, bind_error, key_matches
from conductor_engine.runtime.serve.app import UI_URL_HEADER, WORKFLOW_ID_HEADER, create_app
from conductor_engine.runtime.serve.catalog import ModelCatalog
from conductor_engine.runtime.serve.guard import ServeLimits, uvicorn_config
from tests.agent_server import Reply
from tests.cli import CONDUCTOR, run_conductor, stack_env
from tests.conftest import free_port, make_pool, running_worker, write_pool
from tests.plans import plan_json

KEY = "sk-serve-test-key"


@asynccontextmanager
async def serving(conductor: ConductorClient, trace_store: TraceStore,
                  keys: list[str]) -> AsyncIterator[str]:
    """The app on uvicorn as `conductor serve` runs it (runtime/serve/guard.py), in this
    event loop, on a free port; yields its /v1 base URL."""
    catalog = ModelCatalog("conductor", PolicyRegistry(trace_store.pool).latest_version)
    port = free_port()
    server = uvicorn.Server(uvicorn_config(create_app(conductor, catalog, keys),
                                           ServeLimits.of(conductor.settings), host="127.0.0.1",
                                           port=port, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    deadline = time.monotonic() + 30
    while not server.started:
        assert not task.done() and time.monotonic() < deadline, "uvicorn did not start"
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        await task


@pytest.fixture
async def served(agent_server, conductor: ConductorClient, client: Client, settings: Settings,
                 trace_store: TraceStore) -> AsyncIterator[str]:
    async with running_worker(client, settings, make_pool(agent_server)), \
            serving(conductor, trace_store, [KEY, "sk-another-key"]) as base_url:
        yield base_url


def _client(base_url: str, key: str = KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0)


async def test_an_answer_with_usage_and_its_workflow(
    agent_server, served: str, client: Client, conductor: ConductorClient, settings: Settings,
) -> None:
    agent_server.script("conductor", [Reply.ok(plan_json(("gpt", "Compute it.", [])))])
    agent_server.script("gpt", [Reply.ok("42", input_tokens=30, output_tokens=2)])
    raw = await _client(served).chat.completions.with_raw_response.create(
        model="conductor", messages=[
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "What is 6 x 7?"}])
    completion = raw.parse()
    assert completion.choices[0].message.content == "42"
    assert completion.choices[0].finish_reason == "stop"
    wid = raw.headers[WORKFLOW_ID_HEADER]
    assert raw.headers[UI_URL_HEADER] == settings.workflow_url(wid)
    desc = await client.get_workflow_handle(wid).describe()
    assert desc.status == WorkflowExecutionStatus.COMPLETED
    result = await conductor.result(wid)
    assert result.answer == "42"
    usage = completion.usage
    assert usage is not None and usage.completion_tokens >= 2
    assert usage.prompt_tokens == result.totals.usage.input_tokens > 30
    assert usage.completion_tokens == result.totals.usage.output_tokens
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    # the earlier messages reached the conductor as the task's context, the last as the task
    plan_prompt = "\n".join(m["content"] for m in agent_server.requests("conductor")[0].messages)
    assert "Answer briefly." in plan_prompt and "Task:\nWhat is 6 x 7?" in plan_prompt


async def test_a_streamed_answer(agent_server, served: str) -> None:
    agent_server.script("conductor", [Reply.ok(plan_json(("gpt", "Compute it.", [])))])
    agent_server.script("gpt", [Reply.ok("forty-two")])
    stream = await _client(served).chat.completions.create(
        model="conductor@latest", messages=[{"role": "user", "content": "6 x 7?"}],
        stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "forty-two"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0
    assert len({c.id for c in chunks}) == 1


async def test_a_key_is_required_and_must_be_right(served: str) -> None:
    async with httpx.AsyncClient() as http:
        bare = await http.post(f"{served}/chat/completions", json={
            "model": "conductor", "messages": [{"role": "user", "content": "hi"}]})
    assert bare.status_code == 401
    assert bare.json()["error"]["type"] == "authentication_error"
    assert "Authorization: Bearer" in bare.json()["error"]["message"]
    with pytest.raises(openai.AuthenticationError) as wrong:
        await _client(served, "sk-wrong").chat.completions.create(
            model="conductor", messages=[{"role": "user", "content": "hi"}])
    assert wrong.value.status_code == 401 and wrong.value.code == "invalid_api_key"
    assert "sk-wrong" not in str(wrong.value.body)
    with pytest.raises(openai.AuthenticationError):
        await _client(served, "sk-wrong").models.list()
    assert (await _client(served, "sk-another-key").models.list()).data  # the second key works


async def test_models_lists_the_conductor_and_an_unknown_model_is_404(served: str) -> None:
    listed = [m.id async for m in _client(served).models.list()]
    assert listed[0] == "conductor" and "conductor@base" in listed
    for model in ("conductor@v7", "gpt-4o"):
        with pytest.raises(openai.NotFoundError) as missing:
            await _client(served).chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}])
        assert missing.value.code == "model_not_found"
        if model == "conductor@v7":
            assert "no version v7 (newest: base)" in missing.value.message
    with pytest.raises(openai.BadRequestError) as bad:  # the task must be the user's
        await _client(served).chat.completions.create(
            model="conductor", messages=[{"role": "assistant", "content": "hi"}])
    assert "the last message must be the user's" in str(bad.value.body)


async def test_a_failed_run_is_a_502_with_its_reason(agent_server, served: str) -> None:
    agent_server.script("conductor", [Reply.ok("no plan here")] * 3)
    with pytest.raises(openai.APIStatusError) as failed:
        await _client(served).chat.completions.create(
            model="conductor", messages=[{"role": "user", "content": "hi"}])
    assert failed.value.status_code == 502
    assert failed.value.code == "run_invalid_plan"
    assert failed.value.response.headers[WORKFLOW_ID_HEADER].startswith("conduct-chat-")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_client_that_hangs_up_cancels_the_run(
    agent_server, served: str, client: Client, conductor: ConductorClient, settings: Settings,
    stream: bool,
) -> None:
    agent_server.script("conductor", [Reply.ok(plan_json(("gpt", "Think for long.", [])))])
    agent_server.script("gpt", [Reply.ok("too late").after(120)])
    body = {"model": "conductor", "stream": stream,
            "messages": [{"role": "user", "content": f"slow {uuid.uuid4().hex}"}]}
    async with httpx.AsyncClient(timeout=60) as http:
        request = http.build_request("POST", f"{served}/chat/completions", json=body,
                                     headers={"Authorization": f"Bearer {KEY}"})
        sending = asyncio.create_task(http.send(request, stream=True))
        deadline = time.monotonic() + 60
        while agent_server.calls("gpt") == 0:  # the run is at its step
            assert time.monotonic() < deadline
            assert stream or not sending.done(), "a whole answer waits for the run"
            await asyncio.sleep(0.05)
        runs = []
        while not runs:  # its workflow, by this test's own task queue
            runs = await conductor.list(query=f'TaskQueue = "{conductor.task_queue}"')
            assert time.monotonic() < deadline
        wid = runs[0].workflow_id
        if stream:
            response = await sending
            assert response.headers[WORKFLOW_ID_HEADER] == wid
            await response.aclose()
        else:
            sending.cancel()
    status = None
    while time.monotonic() < deadline:
        status = (await client.get_workflow_handle(wid).describe()).status
        if status == WorkflowExecutionStatus.CANCELED:
            break
        await asyncio.sleep(0.1)
    assert status == WorkflowExecutionStatus.CANCELED


def test_keys_compare_whole_and_no_key_means_loopback_only() -> None:
    assert key_matches("sk-a", ["sk-b", "sk-a"]) and not key_matches("sk-", ["sk-a"])
    assert not key_matches("", ["sk-a"]) and not key_matches("sk-a", [])
    assert bind_error("127.0.0.1", []) is None and bind_error("::1", []) is None
    assert bind_error("localhost", []) is None and bind_error("0.0.0.0", ["k"]) is None
    line = bind_error("0.0.0.0", [])
    assert line is not None and "CONDUCTOR_API_KEYS" in line and "\n" not in line


def test_the_command_refuses_an_open_address_without_keys() -> None:
    env = {k: v for k, v in os.environ.items() if k != API_KEYS_ENV}
    proc = run_conductor("serve", "--host", "0.0.0.0", "--port", str(free_port()), env=env)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: refusing to serve on 0.0.0.0 with no API keys")


async def test_the_command_serves_the_pools_conductor(
    agent_server, client: Client, settings: Settings, tmp_path: Path,
) -> None:
    """`conductor serve` as a person starts it (a worker beside it), asked by curl's peer."""
    pool = make_pool(agent_server)
    agent_server.script("conductor", [Reply.ok(plan_json(("gpt", "Say hi.", [])))])
    agent_server.script("gpt", [Reply.ok("hi there")])
    port = free_port()
    env = {**stack_env(settings, write_pool(pool, tmp_path / "pool.toml")),
           API_KEYS_ENV: f"{KEY}, sk-second"}
    proc = await asyncio.create_subprocess_exec(
        *CONDUCTOR, "serve", "--port", str(port), env=env, cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async with running_worker(client, settings, pool), httpx.AsyncClient() as http:
            deadline = time.monotonic() + 60
            while True:
                try:
                    models = await http.get(f"http://127.0.0.1:{port}/v1/models",
                                            headers={"Authorization": "Bearer sk-second"})
                    break
                except httpx.ConnectError:
                    assert proc.returncode is None and time.monotonic() < deadline
                    await asyncio.sleep(0.2)
            assert models.status_code == 200
            assert models.json()["data"][0]["id"] == "conductor"
            answer = await _client(f"http://127.0.0.1:{port}/v1").chat.completions.create(
                model="conductor", messages=[{"role": "user", "content": "Greet me."}])
            assert answer.choices[0].message.content == "hi there"
    finally:
        proc.terminate()
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert "serving model conductor at http://127.0.0.1" in err.decode()
    assert KEY not in err.decode()


async def test_a_run_past_the_timeout_is_a_504_and_goes_on(
    agent_server, conductor: ConductorClient, client: Client, settings: Settings,
    trace_store: TraceStore,
) -> None:
    agent_server.script("conductor", [Reply.ok(plan_json(("gpt", "Think for long.", [])))])
    agent_server.script("gpt", [Reply.ok("late").after(120)])
    catalog = ModelCatalog("conductor", PolicyRegistry(trace_store.pool).latest_version)
    app = create_app(conductor, catalog, [KEY], run_timeout_s=1)
    async with running_worker(client, settings, make_pool(agent_server)), \
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), timeout=60) as http:
        reply = await http.post("http://serve/v1/chat/completions", json={
            "model": "conductor", "messages": [{"role": "user", "content": "slow"}]},
            headers={"Authorization": f"Bearer {KEY}"})
        assert reply.status_code == 504, reply.text
        error = reply.json()["error"]
        wid = reply.headers[WORKFLOW_ID_HEADER]
        assert error["code"] == "run_timeout" and f"conductor result {wid}" in error["message"]
        desc = await client.get_workflow_handle(wid).describe()
        assert desc.status == WorkflowExecutionStatus.RUNNING, "the run goes on"
        await conductor.cancel(wid)
        with pytest.raises(RunFailed, match="cancel"):  # ended before its worker stops
            await conductor.result(wid)
