"""Telling a serving engine about a new policy version: vLLM's runtime LoRA loading.

vLLM's OpenAI-compatible server, started with `--enable-lora` and the environment variable
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`, loads an adapter on `POST /v1/load_lora_adapter`
`{"lora_name": ..., "lora_path": ...}` and from then on serves it as a model of that name, so a
chat completion for `model = "NAME-vK"` runs the base model with version K's adapter. Its
answers, which this module relies on:

- 200 (text "Success: LoRA adapter ... added successfully") when the adapter loaded;
- 400 "The lora adapter 'X' has already been loaded ..." for a name it already holds: success
  here (another worker, or this one before a crash, got there first);
- 404 "Loading lora X failed: No adapter found for PATH" when it cannot read PATH (matched by
  those words, whatever the status);
- 404 (FastAPI's {"detail": "Not Found"}) when the route does not exist, which is what a server
  without `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` does; "LoRA is not enabled. Use
  --enable-lora" when the server runs without `--enable-lora`, and "LoRA rank R is greater than
  max_lora_rank M" for an adapter above `--max-lora-rank` (400, or 500 in newer releases:
  both are permanent here);
- and, for completions, 404 "The model `X` does not exist." for a name it does not hold (the
  adapter was never loaded, or vLLM restarted and lost it).

`lora_path` is read by the vLLM process, so it must name a directory on the vLLM host: the
engine materialises versions under `Settings.lora_root` (CONDUCTOR_LORA_DIR), which must be a
directory both processes see at the same path.

Each (server, adapter name) is loaded once per process: callers arriving while a load is in
flight wait for that one request, and success is remembered. `forget_lora_adapter` drops that
memory when a completion says vLLM no longer holds the adapter, so the next attempt loads it
again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import structlog

from conductor_engine.engine.providers import errors
from conductor_engine.engine.providers.base import AgentCallError, is_retryable_status
from conductor_engine.engine.providers.pool import AgentSpec
from conductor_engine.engine.redaction import redact_url
from conductor_engine.engine.storage.policies import PolicyVersion, served_name

log = structlog.get_logger(__name__)

# `kind` values (the plan activity's ApplicationError types).
RUNTIME_LORA_OFF = "VLLMRuntimeLoRAOff"
LORA_PATH_NOT_FOUND = "LoRAPathNotFound"
LORA_LOAD_FAILED = "LoRALoadFailed"
LORA_ADAPTER_LOST = "LoRAAdapterLost"

_ENABLE = (
    "start vLLM with --enable-lora (and --max-lora-rank at least the adapter's rank) and the "
    "environment variable VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
)

_Key = tuple[str, str]  # (server base URL, served adapter name)
_loaded: set[_Key] = set()
_in_flight: dict[tuple[asyncio.AbstractEventLoop, str, str], asyncio.Task[None]] = {}


def _key(spec: AgentSpec, name: str) -> _Key:
    return (spec.base_url or "").rstrip("/"), name


def admin_url(base_url: str, route: str) -> str:
    """vLLM's `/v1/<route>` from a pool `base_url`, which names the server's `/v1` root (as the
    OpenAI SDK wants) or the server itself."""
    base = base_url.rstrip("/")
    return f"{base}/{route}" if base.endswith("/v1") else f"{base}/v1/{route}"


def forget_lora_adapter(spec: AgentSpec, name: str) -> bool:
    """Forget that the server at `spec.base_url` holds adapter `name` (it said it does not: it
    restarted). True if this process had loaded it, so loading it again may help."""
    key = _key(spec, name)
    held = key in _loaded
    _loaded.discard(key)
    return held


async def ensure_lora_adapter(spec: AgentSpec, version: PolicyVersion, lora_path: Path) -> None:
    """Make the openai-compatible server of `spec` serve `version` as `NAME-vK`, loading the
    adapter in `lora_path` (a directory the server can read) unless this process already did.

    Raises AgentCallError: retryable for 5xx, timeouts and connection errors; otherwise not,
    with a message saying what to change.
    """
    name = served_name(version.name, version.version)
    key = _key(spec, name)
    if key in _loaded:
        return
    loop = asyncio.get_running_loop()
    flight = (loop, *key)
    task = _in_flight.get(flight)
    if task is None:
        task = loop.create_task(_load(spec, name, lora_path))
        _in_flight[flight] = task

        def _landed(t: asyncio.Task[None]) -> None:
            _in_flight.pop(flight, None)
            if not t.cancelled():
                t.exception()  # retrieved here too, in case every waiter was cancelled

        task.add_done_callback(_landed)
    # shielded: a caller that is cancelled leaves the shared request running for the others
    await asyncio.shield(task)


async def _load(spec: AgentSpec, name: str, lora_path: Path) -> None:
    assert spec.base_url is not None, "an openai-compatible agent always has a base_url"
    api_key = errors.require_api_key(spec)
    headers = {} if api_key == errors.PLACEHOLDER_KEY else {"Authorization": f"Bearer {api_key}"}
    url = admin_url(spec.base_url, "load_lora_adapter")
    path = str(lora_path.resolve())
    try:
        async with httpx.AsyncClient(timeout=spec.timeout_s) as http:
            response = await http.post(
                url, json={"lora_name": name, "lora_path": path}, headers=headers
            )
    except httpx.TimeoutException as e:
        raise AgentCallError(
            f"agent {spec.id}: loading adapter {name} into {spec.base_url} took longer than "
            f"timeout_s={spec.timeout_s:g} s; will be retried",
            retryable=True, kind=errors.TIMEOUT,
        ) from e
    except httpx.HTTPError as e:
        raise errors.connection_error(spec, f"{type(e).__name__}: {e}") from e
    status = response.status_code
    said = "" if status == 200 else _message(response, api_key)
    if status != 200 and "already been loaded" not in said and "already loaded" not in said:
        raise _load_error(spec, name, path, status, said, response, api_key)
    _loaded.add(_key(spec, name))
    log.info("lora adapter loaded", agent=spec.id, adapter=name, path=path,
             already=status != 200)


def _message(response: httpx.Response, api_key: str) -> str:
    """The server's error message, shortened, with the key blanked should it be echoed."""
    try:
        body: object = response.json()
    except ValueError:
        body = response.text
    said = " ".join(errors.server_message(body, response.reason_phrase).split())
    if api_key != errors.PLACEHOLDER_KEY:
        said = said.replace(api_key, "***")
    return said[:500]


def _load_error(spec: AgentSpec, name: str, path: str, status: int, said: str,
                response: httpx.Response, api_key: str) -> AgentCallError:
    where = redact_url(spec.base_url or "")
    if "No adapter found" in said:
        return AgentCallError(
            f"agent {spec.id}: vLLM at {where} cannot read adapter {name} at {path} (HTTP "
            f"{status}: {said}); the LoRA directory must be a path the vLLM server can read: "
            f"set CONDUCTOR_LORA_DIR (setting lora_dir) to a directory shared with the vLLM "
            f"host, mounted at the same path on both",
            retryable=False, status=status, kind=LORA_PATH_NOT_FOUND,
        )
    if "LoRA is not enabled" in said or (status in (404, 405) and "adapter" not in said):
        return AgentCallError(
            f"agent {spec.id}: the server at {where} cannot load LoRA adapters at runtime "
            f"(HTTP {status} from {response.request.url.path}: {said}), so it cannot serve "
            f"policy version {name}; {_ENABLE}, or pin policy_version = 'base'",
            retryable=False, status=status, kind=RUNTIME_LORA_OFF,
        )
    if "max_lora_rank" in said:  # newer vLLM answers this 500, but retrying cannot help
        return AgentCallError(
            f"agent {spec.id}: vLLM at {where} refused adapter {name} (HTTP {status}: {said}); "
            f"start vLLM with --max-lora-rank at least the recipe's lora_r",
            retryable=False, status=status, kind=LORA_LOAD_FAILED,
        )
    if is_retryable_status(status) or status in (401, 403):
        return errors.status_error(spec, status, f"loading adapter {name}: {said}",
                                   response.headers, secret=api_key)
    return AgentCallError(
        f"agent {spec.id}: vLLM at {where} refused adapter {name} from {path} (HTTP {status}: "
        f"{said}); check that it was trained on the model vLLM serves ({spec.model}) and that "
        f"vLLM's --max-lora-rank is at least its rank",
        retryable=False, status=status, kind=LORA_LOAD_FAILED,
    )
