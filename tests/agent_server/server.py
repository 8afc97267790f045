"""The scripted server itself: a POST decoded by its API family's codec (wire.py routes it),
scripted and chosen replies, recorded requests, delayed replies and hang-ups, start and stop,
and the session fixture `agent_server`."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from conductor_engine.engine.providers.pool import AgentSpec
from tests.agent_server import vllm, wire
from tests.agent_server.codec import AgentRequest
from tests.agent_server.reply import Reply, Responder, echo_ok


@dataclass
class _Script:
    queue: deque[Reply] = field(default_factory=deque)
    last: Reply | None = None
    then: Responder | None = None


class AgentServer:
    """The scripted server. Thread-safe: the SDKs may call it from many steps at once."""

    def __init__(self, default_reply: Responder = echo_ok) -> None:
        self.default_reply = default_reply
        self._lock = threading.Lock()
        self._scripts: dict[str, _Script] = {}
        self._requests: list[AgentRequest] = []
        self._lora = vllm.RuntimeLora()  # guarded by self._lock, as everything above
        self._closing = threading.Event()
        self._http = wire.HttpServer(("127.0.0.1", 0), wire.Handler)
        self._http.handle_post = self._handle
        self._thread = threading.Thread(
            target=self._http.serve_forever, name="agent-server", daemon=True
        )

    # -- lifecycle

    def start(self) -> AgentServer:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving; delayed replies still waiting are cut short."""
        self._closing.set()
        self._http.shutdown()
        self._http.server_close()

    def __enter__(self) -> AgentServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- addresses

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def openai_base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.url

    @property
    def gemini_base_url(self) -> str:
        return self.url

    def base_url_for(self, provider: str) -> str:
        """The base URL an AgentSpec of this provider should use to reach this server."""
        if provider in ("openai", "openai-compatible"):
            return self.openai_base_url
        if provider == "anthropic":
            return self.anthropic_base_url
        if provider == "google":
            return self.gemini_base_url
        raise ValueError(f"the agent server does not speak provider {provider!r}")

    def spec(self, provider: str, model: str, **fields: Any) -> AgentSpec:
        """An AgentSpec aimed at this server; `fields` override anything (id, timeout_s, ...)."""
        values: dict[str, Any] = {
            "id": f"{provider}-{model}",
            "provider": provider,
            "model": model,
            "base_url": self.base_url_for(provider),
        }
        values.update(fields)
        return AgentSpec.model_validate(values)

    # -- scripting and recording

    def script(
        self, model: str, replies: Sequence[Reply | str], *, then: Responder | None = None
    ) -> None:
        """Answer the next calls for `model` with `replies` in order; afterwards call `then`
        with the request text if given, else repeat the last reply. Replaces any earlier script.
        """
        queue = deque(r if isinstance(r, Reply) else Reply.ok(r) for r in replies)
        with self._lock:
            self._scripts[model] = _Script(queue=queue, then=then)

    def set_responder(self, model: str, fn: Responder) -> None:
        """Answer every call for `model` with fn(request_text): a str, or a Reply."""
        self.script(model, [], then=fn)

    def calls(self, model: str | None = None) -> int:
        """Requests received for `model` (all models if None), counted on arrival."""
        with self._lock:
            return sum(1 for r in self._requests if model is None or r.model == model)

    def billed(self, model: str | None = None) -> int:
        """Well-formed answers written to a client (of `model`, or all): what a provider bills.
        Errors, malformed bodies and replies the client hung up on are not billed."""
        with self._lock:
            return sum(r.billed for r in self._requests if model is None or r.model == model)

    def requests(self, model: str | None = None) -> list[AgentRequest]:
        with self._lock:
            return [r for r in self._requests if model is None or r.model == model]

    def reset(self) -> None:
        """Forget every script, responder and recorded request (and every LoRA adapter)."""
        with self._lock:
            self._scripts.clear()
            self._requests.clear()
            self._lora.reset()

    def _next_reply(self, request: AgentRequest) -> Reply:
        """Record the request and choose its reply (responders run outside the lock)."""
        with self._lock:
            self._requests.append(request)
            script = self._scripts.get(request.model)
            if script is not None and script.queue:
                script.last = script.queue.popleft()
                return script.last
            if script is not None and script.then is None and script.last is not None:
                return script.last
            fn = script.then if script is not None and script.then else self.default_reply
        answer = fn(request.text)
        return answer if isinstance(answer, Reply) else Reply.ok(answer)

    # -- runtime LoRA (vLLM; see vllm.py)

    def vllm_lora(self, *, runtime_updating: bool = True, load_delay_s: float = 0.0) -> None:
        """Serve the LoRA routes (or 404 them, as vLLM without runtime updating); each load
        takes `load_delay_s` (so concurrent loads overlap)."""
        with self._lock:
            self._lora.runtime_updating, self._lora.load_delay_s = runtime_updating, load_delay_s

    def lora_calls(self, route: vllm.LoraRoute | None = None) -> list[vllm.LoraCall]:
        with self._lock:
            return [c for c in self._lora.calls if route is None or c.route == route]

    def adapters(self) -> dict[str, str]:
        """The adapters loaded now: name -> path."""
        with self._lock:
            return dict(self._lora.adapters)

    def drop_adapters(self) -> None:
        """Forget every loaded adapter, as a restarted vLLM does."""
        with self._lock:
            self._lora.adapters.clear()

    def _unknown_adapter(self, request: AgentRequest) -> bool:
        """A chat completion for an adapter name vLLM does not hold (recorded all the same)."""
        if request.api != "openai" or not vllm.is_adapter_name(request.model):
            return False
        with self._lock:
            if request.model in self._lora.adapters:
                return False
            self._requests.append(request)
        return True

    # -- HTTP (the plumbing is in wire.py)

    def _handle(self, h: wire.Handler) -> None:
        path, _, query = h.path.partition("?")
        length = int(h.headers.get("content-length") or 0)
        raw = h.rfile.read(length) if length else b""
        key = wire.api_key({k.lower(): v for k, v in h.headers.items()}, query)
        if path in vllm.ROUTES:
            wire.send(h, *self._lora_call(vllm.ROUTES[path], raw, key), {})
            return
        found = wire.route(path)
        if found is None:
            wire.send(h, 404, {"error": {"message": f"no route for POST {path}"}}, {})
            return
        api, path_model = found
        codec = wire.CODECS[api]
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            wire.send(h, 400, codec.error(400, "request body is not JSON"), {})
            return
        request = codec.decode(body, path_model)
        request.api_key, request.path, request.body = key, path, body
        if self._unknown_adapter(request):
            wire.send(h, 404, vllm.unknown_model(request.model), {})
            return
        reply = self._next_reply(request)
        if reply.delay_s > 0 and self._wait(h, request, reply.delay_s):
            return
        if wire.hung_up(h.connection):  # a responder held it, and the client went away
            with self._lock:
                request.hung_up = True
            h.close_connection = True
            return
        if reply.body is not None:
            payload: bytes | dict[str, Any] = reply.body
        elif reply.status != 200:
            payload = codec.error(reply.status, reply.text)
        else:
            payload = codec.encode(reply, request)
        sent = wire.send(h, reply.status, payload, reply.headers)
        if sent and reply.status == 200 and reply.body is None:
            with self._lock:
                request.billed = True

    def _lora_call(self, lora_route: vllm.LoraRoute, raw: bytes,
                   key: str | None) -> tuple[int, bytes | dict[str, Any]]:
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            body = {}
        if lora_route == "load" and self._lora.load_delay_s > 0:
            self._closing.wait(self._lora.load_delay_s)
        with self._lock:
            return self._lora.call(lora_route, body.get("lora_name"), body.get("lora_path"), key)

    def _wait(self, h: wire.Handler, request: AgentRequest, seconds: float) -> bool:
        """Hold a delayed reply; True (send nothing) if the server closes or the client hangs
        up first, which is recorded on the request."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self._closing.wait(min(left, 0.05)):
                return True
            if wire.hung_up(h.connection):
                with self._lock:
                    request.hung_up = True
                h.close_connection = True
                return True
        return False


@contextmanager
def start_agent_server(default_reply: Responder = echo_ok) -> Iterator[AgentServer]:
    """A started server for the length of a `with` block (benchmarks, scripts)."""
    server = AgentServer(default_reply).start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def agent_server() -> Iterator[AgentServer]:
    """One server for the whole session; each test calls `agent_server.reset()` as it needs."""
    with start_agent_server() as server:
        yield server
