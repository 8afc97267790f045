"""Trained versions in the local provider (engine/providers/local/model.py): each built from
the base model this process holds, not loaded from disk again, with the same weights a load
from disk gives, sharing the base's tokenizer and grammar compiler; the newest two kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from conductor_engine.engine.providers.local import model as local_model
from conductor_engine.engine.providers.local.device import DEVICE_ENV
from conductor_engine.engine.providers.pool import AgentSpec

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from tests.grpo_inputs import tiny_model_dir  # noqa: E402


def _adapters(base: Path, out: Path, n: int) -> list[Path]:
    """`n` LoRA adapters of the tiny model, each with its own random B (so not a no-op)."""
    from conductor_engine.engine.contracts.training import PolicyConfig
    from conductor_engine.trainer.policy import load_policy, save_checkpoint

    paths = []
    for k in range(n):
        policy = load_policy(PolicyConfig(base=str(base), lora=True, lora_r=4, device="cpu"))
        torch.manual_seed(k)
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.data.normal_(0, 0.5)
        paths.append(out / f"v{k + 1}")
        save_checkpoint(policy, paths[-1])
    return paths


def test_a_version_is_the_held_base_with_its_adapter_merged_as_a_load_from_disk_gives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    monkeypatch.setattr(local_model, "loaded_models", {})
    base = tiny_model_dir(tmp_path / "base")
    versions = _adapters(base, tmp_path, 3)
    spec = AgentSpec(id="conductor", provider="local", model=str(base))
    held = local_model.load_model(spec)
    held.xgrammar_compiler = object()  # built by the first plan; the versions share it
    ids = torch.tensor([[3, 5, 7, 9, 11]])

    loaded = []
    for path in versions:
        version = local_model.load_model(spec.model_copy(update={"checkpoint": str(path)}))
        assert version.model is not held.model and version.tokenizer is held.tokenizer
        assert version.xgrammar_compiler is held.xgrammar_compiler
        fresh = local_model.load_base_model(spec)  # what a load from disk gave before
        local_model._apply_checkpoint(spec.model_copy(update={"checkpoint": str(path)}), fresh)
        with torch.no_grad():
            got = version.model(ids).logits
            assert torch.equal(got, fresh.model(ids).logits)  # bit for bit
            assert not torch.equal(got, held.model(ids).logits)  # the adapter did something
        loaded.append(version)
    # the base untouched by the merges, and the newest two versions kept beside it
    with torch.no_grad():
        plain = local_model.load_base_model(spec)
        assert torch.equal(held.model(ids).logits, plain.model(ids).logits)
    assert list(local_model.loaded_models) == [
        str(base), *(f"{base}@{p}" for p in versions[1:])]
