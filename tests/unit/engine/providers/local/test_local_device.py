"""Where the local model runs (CONDUCTOR_LOCAL_DEVICE) and in what precision: the GPU when there
is one, in bfloat16; the CPU in float32 as always; a clear message when a forced GPU is absent."""

from __future__ import annotations

import importlib.util

import pytest

from conductor_engine.engine.providers.base import AgentCallError
from conductor_engine.engine.providers.local import model as local_model
from conductor_engine.engine.providers.local.device import (
    DEVICE_ENV,
    choose_device,
    placement,
    weights_dtype,
)
from conductor_engine.engine.providers.local.errors import LOAD_FAILED
from conductor_engine.engine.providers.local.weights import SMOLLM2
from conductor_engine.engine.providers.pool import AgentSpec

torch = pytest.importorskip("torch")

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
SPEC = AgentSpec(id="smollm2", provider="local", model=SMOLLM2)


def test_cpu_forced_runs_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    assert choose_device("a") == torch.device("cpu")


@no_gpu
def test_auto_without_a_gpu_is_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    assert choose_device("a") == torch.device("cpu")


@no_gpu
@pytest.mark.parametrize("wanted", ["cuda", "cuda:1", " CUDA "])
def test_cuda_forced_without_a_gpu_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch, wanted: str,
) -> None:
    monkeypatch.setenv(DEVICE_ENV, wanted)
    with pytest.raises(AgentCallError) as caught:
        choose_device("conductor")
    message = str(caught.value)
    assert caught.value.retryable is False and caught.value.kind == LOAD_FAILED
    assert "agent conductor" in message and "no CUDA GPU" in message
    assert f"{DEVICE_ENV}=cpu" in message and "\n" not in message


def test_a_device_that_is_not_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEVICE_ENV, "tpu")
    with pytest.raises(AgentCallError, match="not a device; set it to auto, cpu, cuda"):
        choose_device("a")


@no_gpu
@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="the local extra is not installed")
def test_loading_with_cuda_forced_and_no_gpu_fails_before_reading_weights(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The provider's own load path checks the device first: no conversion, no download."""
    monkeypatch.setenv(DEVICE_ENV, "cuda")
    with pytest.raises(AgentCallError, match="no CUDA GPU"):
        local_model.load_base_model(SPEC)


def test_weights_are_float32_on_the_cpu_and_bfloat16_on_a_gpu() -> None:
    assert weights_dtype(torch.device("cpu")) == torch.float32
    assert weights_dtype(None) == torch.float32
    assert weights_dtype(torch.device("cuda")) == torch.bfloat16


def test_only_a_gpu_load_gets_a_device_map() -> None:
    """On the CPU `from_pretrained` is called exactly as before (float32, no device map)."""
    assert placement(torch.device("cpu")) == {"dtype": torch.float32}
    gpu = placement(torch.device("cuda:0"))
    assert gpu["dtype"] == torch.bfloat16
    if importlib.util.find_spec("accelerate") is not None:
        assert gpu["device_map"] == "cuda:0"
