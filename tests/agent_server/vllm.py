"""vLLM's runtime LoRA routes, as vLLM started with --enable-lora and
VLLM_ALLOW_RUNTIME_LORA_UPDATING=True answers them:

    POST /v1/load_lora_adapter     {"lora_name": ..., "lora_path": ...}
    POST /v1/unload_lora_adapter   {"lora_name": ...}

A load is 200 the first time, 400 "has already been loaded" for a name it holds, 404 "No
adapter found for PATH" for a directory that does not exist here; an unload of a name it does
not hold is 404. A chat completion for an adapter-style model name (`NAME-vK`) is 404 "The model
`NAME-vK` does not exist." until that name is loaded. Without runtime updating both routes are
404 "Not Found".

`RuntimeLora` is the state; it is not thread-safe by itself: the server calls it under its lock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

LoraRoute = Literal["load", "unload"]

ROUTES: dict[str, LoraRoute] = {
    "/v1/load_lora_adapter": "load", "/v1/unload_lora_adapter": "unload",
}
_ADAPTER_NAME = re.compile(r"-v\d+$")  # engine.storage.policies.served_name: NAME-vK


@dataclass(frozen=True)
class LoraCall:
    """One request to the runtime LoRA routes and the status it was answered with."""

    route: LoraRoute
    lora_name: str | None
    lora_path: str | None
    api_key: str | None
    status: int


def error(status: int, message: str, kind: str) -> dict[str, Any]:
    """vLLM's error envelope."""
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def unknown_model(model: str) -> dict[str, Any]:
    """vLLM's 404 for a chat completion naming a model it does not serve."""
    return error(404, f"The model `{model}` does not exist.", "NotFoundError")


def is_adapter_name(model: str) -> bool:
    """Whether a model name is an adapter's (`NAME-vK`), which vLLM serves only once loaded."""
    return _ADAPTER_NAME.search(model) is not None


@dataclass
class RuntimeLora:
    """The adapters one vLLM holds, and every call to its LoRA routes."""

    runtime_updating: bool = True  # False: the routes 404, as vLLM without runtime updating
    load_delay_s: float = 0.0  # how long each load takes
    adapters: dict[str, str] = field(default_factory=dict)  # name -> path
    calls: list[LoraCall] = field(default_factory=list)

    def reset(self) -> None:
        self.adapters.clear()
        self.calls.clear()
        self.runtime_updating, self.load_delay_s = True, 0.0

    def call(self, route: LoraRoute, name: str | None, path: str | None,
             api_key: str | None) -> tuple[int, bytes | dict[str, Any]]:
        """Answer one call and record it."""
        status, payload = self._answer(route, name, path)
        self.calls.append(LoraCall(route, name, path, api_key, status))
        return status, payload

    def _answer(self, route: LoraRoute, name: str | None,
                path: str | None) -> tuple[int, bytes | dict[str, Any]]:
        """vLLM's answer (OpenAIServingModels.load_lora_adapter / unload_lora_adapter)."""
        if not self.runtime_updating:
            return 404, {"detail": "Not Found"}
        if route == "unload":
            if name not in self.adapters:
                return 404, error(404, f"The lora adapter '{name}' cannot be found.",
                                  "NotFoundError")
            del self.adapters[name]
            return 200, f"Success: LoRA adapter '{name}' removed successfully.".encode()
        if not name or not path:
            return 400, error(400, "Both 'lora_name' and 'lora_path' must be provided.",
                              "InvalidUserInput")
        if name in self.adapters:
            return 400, error(
                400, f"The lora adapter '{name}' has already been loaded. If you want to load "
                "the adapter in place, set 'load_inplace' to True.", "InvalidUserInput")
        if not Path(path).is_dir():
            return 404, error(
                404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError")
        self.adapters[name] = path
        return 200, f"Success: LoRA adapter '{name}' added successfully.".encode()
