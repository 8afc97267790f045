"""vLLM's OpenAI-compatible server, played by the local model: a conductor served "behind the
wire" as production serves it, on a machine without vLLM.

    with LocalVllm("smollm2-135m-instruct") as server:
        conductor = {"provider": "openai-compatible", "model": "smollm2-135m-instruct",
                     "base_url": server.openai_base_url}

What it answers, as vLLM (>= 0.12, --enable-lora, VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) does:

- `POST /v1/chat/completions` for the base model's name, or for an adapter loaded under its
  name: `structured_outputs: {"json": schema, "disable_any_whitespace": true}` constrains the
  sampling; the choice carries `token_ids` (`return_token_ids`), the response
  `prompt_token_ids`, and `logprobs` spells each token "token_id:N" when
  `return_tokens_as_token_ids` is set;
- `POST /v1/load_lora_adapter` / `/v1/unload_lora_adapter` (`lora_name` -> `lora_path`), with
  vLLM's answers (vllm.RuntimeLora); a completion for an adapter-style name it does not hold is
  vLLM's 404 "The model ... does not exist.".

Sampling is the local provider's own (engine/providers/local: batching queue, xgrammar mask,
seeded sampler, a LoRA checkpoint merged into the weights), not a second implementation: a plan
served here is drawn exactly as the local provider would draw it, and only the wire in between
differs. Two differences from vLLM, both outside what the trainer reads:

- the local sampler jumps forward over text the grammar forces, writing that text's own tokens,
  where vLLM samples them one by one (any split the grammar allows): reconstruction records both
  (engine/providers/local/reconstruct.py);
- `logprobs` are the local sampler's (renormalised over a choice set where the grammar allowed
  a few tokens), not vLLM's full-vocabulary ones; the trainer drops a served plan's log-probs and
  recomputes them either way (docs/how-to/served-conductor.md).

Only what a conductor needs is served: one choice (`n = 1`), no streaming, no tools. A request
with a schema in any other form than `structured_outputs.json` without whitespace is refused
(400) rather than sampled under another grammar than it asked for.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from conductor_engine.engine.contracts.agent_calls import Message
from conductor_engine.engine.providers.base import AgentCallError, Completion, CompletionRequest
from conductor_engine.engine.providers.local import batching, load_model
from conductor_engine.engine.providers.pool import AgentSpec
from tests.agent_server import vllm, wire


@dataclass(frozen=True)
class ServedCall:
    """One chat completion this server answered: which model name, which checkpoint (None: the
    base weights), and whether a schema constrained it."""

    model: str
    checkpoint: str | None
    constrained: bool
    seed: int | None


@dataclass
class _State:
    lora: vllm.RuntimeLora = field(default_factory=vllm.RuntimeLora)
    served: list[ServedCall] = field(default_factory=list)


class LocalVllm:
    """The server. Requests are answered on a thread each and meet in the local provider's
    generation queue, which batches them as it batches in-process callers."""

    def __init__(self, model: str) -> None:
        self.model = model  # the base model's name, as vLLM's --model (or --served-model-name)
        self._lock = threading.Lock()
        self._state = _State()
        self._http = wire.HttpServer(("127.0.0.1", 0), wire.Handler)
        self._http.handle_post = self._handle
        self._thread = threading.Thread(
            target=self._http.serve_forever, name="local-vllm", daemon=True)

    # -- lifecycle and addresses

    def start(self) -> LocalVllm:
        self._thread.start()
        return self

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def __enter__(self) -> LocalVllm:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def openai_base_url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    # -- what happened

    def adapters(self) -> dict[str, str]:
        """The adapters loaded now: name -> path."""
        with self._lock:
            return dict(self._state.lora.adapters)

    def lora_calls(self) -> list[vllm.LoraCall]:
        with self._lock:
            return list(self._state.lora.calls)

    def served(self) -> list[ServedCall]:
        with self._lock:
            return list(self._state.served)

    # -- HTTP

    def _handle(self, h: wire.Handler) -> None:
        path = h.path.partition("?")[0]
        length = int(h.headers.get("content-length") or 0)
        try:
            body = json.loads(h.rfile.read(length) if length else b"{}")
        except json.JSONDecodeError:
            wire.send(h, 400, vllm.error(400, "the body is not JSON", "BadRequestError"), {})
            return
        if path in vllm.ROUTES:
            key = wire.api_key({k.lower(): v for k, v in h.headers.items()}, "")
            with self._lock:
                answer = self._state.lora.call(vllm.ROUTES[path], body.get("lora_name"),
                                               body.get("lora_path"), key)
            wire.send(h, *answer, {})
        elif path == "/v1/chat/completions":
            wire.send(h, *self._chat(body), {})
        else:
            wire.send(h, 404, {"detail": "Not Found"}, {})

    def _chat(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        model = str(body.get("model", ""))
        with self._lock:
            checkpoint = self._state.lora.adapters.get(model)
        if model != self.model and checkpoint is None:
            return 404, vllm.unknown_model(model)
        try:
            request = completion_request(body)
        except ValueError as e:
            return 400, vllm.error(400, str(e), "BadRequestError")
        spec = AgentSpec(id="local-vllm", provider="local", model=self.model,
                         checkpoint=checkpoint)
        try:
            completion, prompt, decode = generate(spec, request)
        except AgentCallError as e:
            return (400 if not e.retryable else 500), vllm.error(
                400 if not e.retryable else 500, e.message, "BadRequestError")
        with self._lock:
            self._state.served.append(ServedCall(model, checkpoint,
                                                 request.json_schema is not None, request.seed))
        return 200, chat_response(model, body, completion, prompt, decode)


def completion_request(body: dict[str, Any]) -> CompletionRequest:
    """The local provider's request for a vLLM chat completion body; ValueError for what this
    server does not serve as vLLM would."""
    if body.get("stream") or int(body.get("n") or 1) != 1:
        raise ValueError("this server answers one choice, without streaming")
    if body.get("response_format") or body.get("guided_json"):
        raise ValueError("send the schema as structured_outputs.json (vLLM >= 0.12)")
    structured = body.get("structured_outputs") or {}
    schema = structured.get("json")
    if schema is not None and structured.get("disable_any_whitespace") is not True:
        raise ValueError("structured_outputs.json is compiled without whitespace here "
                         "(disable_any_whitespace: true), as the local provider compiles it")
    return CompletionRequest(
        messages=[Message(role=m.get("role"), content=str(m.get("content") or ""))
                  for m in body.get("messages", [])],
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        max_tokens=int(body.get("max_tokens") or body.get("max_completion_tokens") or 1024),
        json_schema=schema if isinstance(schema, dict) else None,
        seed=body.get("seed"),
    )


def generate(spec: AgentSpec, request: CompletionRequest
             ) -> tuple[Completion, list[int], Callable[[int], str]]:
    """One completion from the local provider's queue (blocking: this is a server thread), the
    prompt's token ids, and the model's token decoder."""
    loaded = load_model(spec)
    job = batching.prepare(spec, loaded, request, None)
    completion = batching.queue.submit(job).result()
    return completion, job.prompt_ids, lambda t: str(loaded.tokenizer.decode([t]))


def chat_response(model: str, body: dict[str, Any], completion: Completion,
                  prompt: list[int], decode: Callable[[int], str]) -> dict[str, Any]:
    """vLLM's chat completion body for a local completion: the wire, never the local records
    (forced positions, choice sets), which a served plan does not carry."""
    ids = completion.token_ids or []
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": completion.text, "refusal": None,
                    "tool_calls": []},
        "logprobs": None,
        "finish_reason": completion.finish_reason or "stop",
        "stop_reason": None,
    }
    if body.get("return_token_ids"):
        choice["token_ids"] = ids
    if body.get("logprobs"):
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        choice["logprobs"] = {"content": [
            {"token": f"token_id:{t}" if as_ids else decode(t), "logprob": lp, "bytes": None,
             "top_logprobs": []}
            for t, lp in zip(ids, completion.logprobs or [], strict=True)]}
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "prompt_token_ids": prompt if body.get("return_token_ids") else None,
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                  "total_tokens": len(prompt) + len(ids)},
    }
