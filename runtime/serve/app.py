"""The OpenAI-compatible HTTP app of `conductor serve` (Starlette; uvicorn runs it).

Each chat completion is one ConductWorkflow, started through ConductorClient like any other
run: the answer is the run's answer (the last step's output), `usage` the run's token totals,
and the workflow id and its Temporal UI link come back as headers (`x-conductor-workflow-id`,
`x-conductor-ui-url`) on every answer, streamed or not, and on a failed run's error too.

A client that hangs up before the answer cancels the run (a Temporal cancel: agent calls in
flight stop, a cancelled trace is recorded), so an abandoned request spends nothing more. A run
that outlives the server's timeout is left running (504; its answer stays one `conductor
result` away), since that client has not gone away by choice.

Errors use OpenAI's body, `{"error": {"message", "type", "param", "code"}}`: 401 for a missing or
wrong key, 400 for a request the conductor cannot run, 404 for a model not offered, 413 for a
body or a conversation over the bounds, 502 for a run that failed or could not start, 504 for a
run over the timeout.

Every request is bounded before it costs anything (docs/reference/limits.md): a body over
MAX_JSON_REQUEST_BYTES is refused from its Content-Length, or as soon as a streamed body passes
it, never read whole; the body is parsed by pydantic-core's JSON parser, which refuses nesting
over about 200 levels and integers over 4,300 digits (a 400, where the standard library's
parser raised RecursionError or ValueError, plain-text 500s); the conversation, as the task it
becomes, is at most MAX_TASK_BYTES (413), checked before any workflow starts.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import structlog
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from temporalio.service import RPCError

from conductor_engine.engine.contracts.limits import MAX_JSON_REQUEST_BYTES, size_label
from conductor_engine.engine.contracts.records import RunResult
from conductor_engine.runtime.client import ConductorClient, RunFailed, TaskTooLarge
from conductor_engine.runtime.serve.access import bearer_token, key_matches
from conductor_engine.runtime.serve.catalog import ModelCatalog, UnknownModel
from conductor_engine.runtime.serve.conversation import BadRequest, chat_task
from conductor_engine.runtime.serve.guard import ServeLimits
from conductor_engine.runtime.serve.wire import (
    MAX_REQUEST_OBJECTS,
    ChatCompletion,
    ChatCompletionChunk,
    ChatRequest,
    Choice,
    ChunkChoice,
    CompletionUsage,
    Delta,
    ErrorType,
    Model,
    ModelList,
    ResponseMessage,
    TooManyObjects,
    error_body,
    read_chat_request,
)

log = structlog.get_logger("conductor.serve")

WORKFLOW_ID_HEADER = "x-conductor-workflow-id"
UI_URL_HEADER = "x-conductor-ui-url"
PARSE_THREADS = 1
"""Request bodies parsed, and tasks built from them, at once, in a thread: both are bounded
(MAX_REQUEST_OBJECTS, MAX_TASK_BYTES) but still CPU work, and in a thread the event loop keeps
serving other clients between its steps. One: pydantic-core's JSON parse holds the interpreter
lock throughout (about 0.15 s for 8 MiB of tiny objects), and two run back to back held the
loop for both."""
KEEP_ALIVE_S = 15.0
"""A streamed answer sends an SSE comment this often while the run works, so proxies keep the
connection open and a client that left is noticed."""


class ApiError(Exception):
    """An error answered in OpenAI's body shape."""

    def __init__(self, status: int, message: str, kind: ErrorType, code: str | None = None,
                 param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.code, self.param = status, kind, code, param
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(str(self), self.kind, self.code, self.param),
                            status_code=self.status, headers=self.headers)


class Disconnected(Exception):
    """The client hung up before the answer."""


# Cancels started as a client leaves run on even if the request's own task is torn down.
_BACKGROUND: set[asyncio.Task[Any]] = set()


def _detach(coro: Awaitable[Any]) -> None:
    task = asyncio.ensure_future(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


async def _until_disconnect(request: Request) -> None:
    """Returns when the client hangs up (the ASGI server's `http.disconnect`)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is over {size_label(limit)}, more than any "
                    "conversation the conductor takes: shorten the messages",
                    "invalid_request_error", "request_too_large")


async def read_body(request: Request, limit: int = MAX_JSON_REQUEST_BYTES,
                    timeout_s: float | None = None) -> bytes:
    """The body, at most `limit` bytes: 413 from a Content-Length over it before reading
    anything, or as soon as a body sent without one (chunked) passes it; 408 when it has not
    all arrived within `timeout_s`."""
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and (len(declared) > 15
                                                       or int(declared) > limit):
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit)
                chunks.append(chunk)
    except ClientDisconnect:  # nobody reads the answer; no traceback for a client that left
        raise ApiError(400, "the client hung up before the whole body arrived",
                       "invalid_request_error") from None
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive whole within {timeout_s:g}s: "
                       "send it at once", "invalid_request_error", "request_timeout",
                       headers={"connection": "close"}) from None
    return b"".join(chunks)


def parse_chat(body: bytes) -> ChatRequest:
    """The chat request in `body`, or a 400 saying what is wrong with it. CPU-bound (a body
    may hold thousands of objects): the app runs it off the event loop."""
    try:
        return read_chat_request(body)
    except TooManyObjects:
        raise ApiError(413, f"the request holds over {MAX_REQUEST_OBJECTS:,} messages and "
                       "content parts, more than any conversation the conductor takes: send "
                       "fewer", "invalid_request_error", "request_too_large") from None
    except ValidationError as e:
        first = e.errors(include_input=False)[0]
        if first["type"] == "json_invalid":
            why = str(first["msg"]).removeprefix("Invalid JSON: ")
            raise ApiError(400, f"the request body is not JSON this server reads: {why} "
                           "(here JSON nests about 200 levels deep at most, and an integer has "
                           "at most 4,300 digits)", "invalid_request_error") from None
        where = ".".join(str(p) for p in first["loc"])
        more = f" ({e.error_count()} problems in all)" if e.error_count() > 1 else ""
        why = str(first["msg"]).removeprefix("Value error, ")
        raise ApiError(400, f"{where or 'body'}: {why}{more}",
                       "invalid_request_error", param=where or None) from None


def _usage(result: RunResult) -> CompletionUsage:
    usage = result.totals.usage
    return CompletionUsage(prompt_tokens=usage.input_tokens,
                           completion_tokens=usage.output_tokens,
                           total_tokens=usage.input_tokens + usage.output_tokens)


def _chunk(wid: str, created: int, model: str, delta: Delta, finish: bool = False,
           usage: CompletionUsage | None = None) -> str:
    """One `chat.completion.chunk` event as OpenAI sends it: `finish_reason` null until the
    stop, the delta holding only what it carries, `usage` only on the last chunk (no
    choices)."""
    choices = [] if usage is not None else [
        ChunkChoice(delta=delta, finish_reason="stop" if finish else None)]
    body = ChatCompletionChunk(id=f"chatcmpl-{wid}", created=created, model=model,
                               choices=choices, usage=usage).model_dump()
    for choice in body["choices"]:
        choice["delta"] = {k: v for k, v in choice["delta"].items() if v is not None}
    if body["usage"] is None:
        del body["usage"]
    return f"data: {json.dumps(body)}\n\n"


class ChatServer:
    """What `conductor serve` answers: the OpenAI routes over one ConductorClient and a model
    catalog. The state a request shares with the others (keys, limits, the parsing slot, the
    timeouts) is held here; each route is a method; `app()` assembles them for uvicorn."""

    def __init__(self, conductor: ConductorClient, catalog: ModelCatalog, keys: Sequence[str],
                 *, run_timeout_s: float = 1800.0, keep_alive_s: float = KEEP_ALIVE_S) -> None:
        self.conductor, self.catalog, self.keys = conductor, catalog, tuple(keys)
        self.settings = conductor.settings
        self.limits = ServeLimits.of(self.settings)
        self.parsing = asyncio.Semaphore(PARSE_THREADS)
        self.run_timeout_s, self.keep_alive_s = run_timeout_s, keep_alive_s

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/models/{model:path}", self.model, methods=["GET"]),
                Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            ],
            exception_handlers={ApiError: _api_error, HTTPException: _http_error,
                                Exception: _unexpected},
        )

    # --- routes ------------------------------------------------------------------------------

    async def models(self, request: Request) -> Response:
        self.authorize(request)
        now = int(time.time())
        names = await self.catalog.names()
        return JSONResponse(ModelList(data=[Model(id=n, created=now) for n in names])
                            .model_dump())

    async def model(self, request: Request) -> Response:
        self.authorize(request)
        name = request.path_params["model"]
        try:
            await self.catalog.policy_version(name)
        except UnknownModel as e:
            raise ApiError(404, str(e), "not_found_error", "model_not_found", "model") from None
        return JSONResponse(Model(id=name, created=int(time.time())).model_dump())

    async def chat_completions(self, request: Request) -> Response:
        self.authorize(request)
        chat = await self.read_request(request)
        wid, headers = await self.start(chat)
        if chat.stream:
            include_usage = bool(chat.stream_options and chat.stream_options.include_usage)
            return StreamingResponse(
                self.stream(request, chat.model, wid, headers, include_usage),
                media_type="text/event-stream",
                headers={**headers, "cache-control": "no-cache", "x-accel-buffering": "no"})
        try:
            res = await self.finish(request, wid, headers)
        except Disconnected:
            return Response(status_code=499)  # nobody reads it: nginx's "client closed"
        return JSONResponse(ChatCompletion(
            id=f"chatcmpl-{wid}", created=int(time.time()), model=chat.model,
            choices=[Choice(message=ResponseMessage(content=res.answer or ""))],
            usage=_usage(res)).model_dump(), headers=headers)

    # --- the steps of a completion -----------------------------------------------------------

    def authorize(self, request: Request) -> None:
        """Nothing when no key is asked for; else a 401 unless the bearer token is a key."""
        if not self.keys:
            return
        token = bearer_token(request.headers.get("authorization"))
        if token is None:
            raise ApiError(401, "no API key: send the header `Authorization: Bearer KEY` with "
                           "a key from the server's CONDUCTOR_API_KEYS", "authentication_error",
                           "invalid_api_key")
        if not key_matches(token, self.keys):
            raise ApiError(401, "wrong API key: use one of the keys in the server's "
                           "CONDUCTOR_API_KEYS", "authentication_error", "invalid_api_key")

    async def read_request(self, request: Request) -> ChatRequest:
        body = await read_body(request, timeout_s=self.limits.body_timeout_s)
        async with self.parsing:
            return await asyncio.to_thread(parse_chat, body)

    async def start(self, chat: ChatRequest) -> tuple[str, dict[str, str]]:
        """Start the run the conversation becomes; its workflow id and the answer's headers."""
        try:
            version = await self.catalog.policy_version(chat.model)
        except UnknownModel as e:
            raise ApiError(404, str(e), "not_found_error", "model_not_found", "model") from None
        try:
            async with self.parsing:
                task = await asyncio.to_thread(chat_task, chat, version)
        except BadRequest as e:
            raise ApiError(400, str(e), "invalid_request_error", param=e.param) from None
        except TaskTooLarge as e:  # refused before any workflow starts
            raise ApiError(413, str(e), "invalid_request_error", "conversation_too_large",
                           "messages") from None
        try:
            wid = await self.conductor.submit(task)
        except RPCError as e:
            raise ApiError(502, f"the run could not start: Temporal answered {e.message}",
                           "server_error", "run_not_started") from None
        log.info("run started", workflow_id=wid, model=chat.model, stream=chat.stream)
        return wid, {WORKFLOW_ID_HEADER: wid, UI_URL_HEADER: self.settings.workflow_url(wid)}

    async def finish(self, request: Request, wid: str, headers: dict[str, str],
                     on_wait: Callable[[], Awaitable[None]] | None = None) -> RunResult:
        """The run's result; Disconnected (the run cancelled) when the client hangs up first,
        ApiError 502 for a failed run, 504 past the timeout. `on_wait` runs each keep-alive."""
        result = asyncio.ensure_future(self.conductor.result(wid))
        gone = asyncio.ensure_future(_until_disconnect(request))
        deadline = time.monotonic() + self.run_timeout_s
        try:
            while not result.done():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ApiError(504, f"the run did not finish within "
                                   f"{self.run_timeout_s:g}s; it goes on: `conductor result "
                                   f"{wid}` (or {UI_URL_HEADER}) gives its answer",
                                   "timeout_error", "run_timeout", headers=headers)
                await asyncio.wait({result, gone}, timeout=min(left, self.keep_alive_s),
                                   return_when=asyncio.FIRST_COMPLETED)
                if gone.done() and not result.done():
                    raise Disconnected()
                if not result.done() and on_wait is not None:
                    await on_wait()
            try:
                res = result.result()
            except RunFailed as e:
                raise ApiError(502, f"the run failed: {e.reason}", "server_error",
                               "run_failed", headers=headers) from None
        except (Disconnected, asyncio.CancelledError):
            if not result.done():
                log.info("client hung up: cancelling the run", workflow_id=wid)
                _detach(self.conductor.cancel(wid, reason="the HTTP client disconnected"))
            raise
        finally:
            result.cancel()
            gone.cancel()
        if res.status != "completed" or res.answer is None:
            why = res.error or "no answer"
            raise ApiError(502, f"the run ended {res.status}: {why}", "server_error",
                           f"run_{res.status}", headers=headers)
        return res

    async def stream(self, request: Request, model: str, wid: str, headers: dict[str, str],
                     include_usage: bool) -> AsyncIterator[str]:
        """The answer as `chat.completion.chunk` events: the assistant role at once (the run
        has started), a keep-alive comment while it works, the answer when it is known (the
        last step's output, whole), the stop, the usage when asked for, then `[DONE]`."""
        created = int(time.time())
        pings: asyncio.Queue[str] = asyncio.Queue()

        async def ping() -> None:
            await pings.put(": keep-alive\n\n")

        yield _chunk(wid, created, model, Delta(role="assistant", content=""))
        waiting = asyncio.ensure_future(self.finish(request, wid, headers, on_wait=ping))
        try:
            while not waiting.done():
                getting = asyncio.ensure_future(pings.get())
                await asyncio.wait({waiting, getting}, return_when=asyncio.FIRST_COMPLETED)
                if getting.done():
                    yield getting.result()
                else:
                    getting.cancel()
            try:
                res = waiting.result()
            except ApiError as e:
                yield f"data: {json.dumps(error_body(str(e), e.kind, e.code))}\n\n"
                yield "data: [DONE]\n\n"
                return
            except Disconnected:
                return
            yield _chunk(wid, created, model, Delta(content=res.answer or ""))
            yield _chunk(wid, created, model, Delta(), finish=True)
            if include_usage:
                yield _chunk(wid, created, model, Delta(), usage=_usage(res))
            yield "data: [DONE]\n\n"
        finally:
            if not waiting.done():  # torn down by the server as the client left
                waiting.cancel()


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return exc.response()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind: ErrorType = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    message = f"no route {request.method} {request.url.path}" if exc.status_code in \
        (404, 405) else str(exc.detail)
    return JSONResponse(error_body(message, kind), status_code=exc.status_code)


async def _unexpected(request: Request, exc: Exception) -> Response:
    """Any other error still answers in OpenAI's shape, never a plain-text 500 (Starlette
    re-raises it after this response, so the server logs it whole)."""
    return JSONResponse(error_body(f"internal error ({type(exc).__name__}); the server log has "
                                   "the details", "server_error", "internal_error"),
                        status_code=500)


def create_app(conductor: ConductorClient, catalog: ModelCatalog, keys: Sequence[str], *,
               run_timeout_s: float = 1800.0, keep_alive_s: float = KEEP_ALIVE_S) -> Starlette:
    """The app (ChatServer's routes): `keys` empty means no key is asked for (the CLI then
    binds loopback only)."""
    return ChatServer(conductor, catalog, keys, run_timeout_s=run_timeout_s,
                      keep_alive_s=keep_alive_s).app()
