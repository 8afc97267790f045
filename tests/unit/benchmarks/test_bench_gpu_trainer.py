"""The GPU benchmark's code path (tests/benchmarks/bench_gpu_trainer.py), on its --small shapes on
the CPU: the paper recipe as the bench builds it, the rollouts of the issue's shapes, and one
update and one bare pass through the trainer's own entry points, so the script a GPU session runs
as one command cannot rot unnoticed."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from tests.benchmarks import bench_gpu_trainer as bench  # noqa: E402


def paper() -> dict[str, dict[str, object]]:
    return tomllib.loads(bench.PAPER_RECIPE.read_text())


def test_recipe_is_the_paper_recipe_with_only_the_base_replaced(tmp_path: Path) -> None:
    lora = bench.paper_recipe(bench.SHAPES["lora7b"], tmp_path)
    full = bench.paper_recipe(bench.SHAPES["full1.5b"], tmp_path)
    expected = paper()
    assert lora.policy.model_dump(exclude={"base"}, exclude_unset=True) == {
        k: v for k, v in expected["policy"].items() if k != "base"}
    assert lora.policy.base == str(tmp_path)
    assert lora.loss.model_dump(exclude_unset=True) == expected["loss"]
    assert full.policy.lora is False and full.loss.learning_rate == 1e-6
    assert (lora.policy.lora_r, lora.policy.lora_target_modules) == (64, "all-linear")


def test_rollouts_have_the_issue_shape_and_are_seeded() -> None:
    shape = bench.SHAPES["lora7b"]
    samples = bench.make_samples(shape)
    assert len(samples) == 256
    prompts = {tuple(s.prompt_ids) for s in samples}
    assert len(prompts) == 4  # 4 tasks of 64, a group sharing its whole prompt
    assert all(860 <= len(p) <= 940 for p in prompts)
    assert len({p[:640] for p in prompts}) == 1  # the instructions every task opens with
    assert all(100 <= len(s.completion_ids) <= 400 for s in samples)
    assert all(s.advantage != 0 for s in samples)
    vocab = shape.config["vocab_size"]
    assert all(bench.EOS < t < vocab for s in samples for t in s.prompt_ids + s.completion_ids)
    again = bench.make_samples(shape)
    assert [(s.prompt_ids, s.completion_ids, s.advantage) for s in again] == \
        [(s.prompt_ids, s.completion_ids, s.advantage) for s in samples]


def test_small_lora_update_trains_the_adapter_and_bare_pass_changes_nothing(
        tmp_path: Path) -> None:
    shape = bench.SMALL["lora7b"]
    b = bench.load(shape, bench.build_model_dir(shape, tmp_path / "m", torch.device("cpu")))
    assert b.policy.kind == "lora" and b.policy.pad_id == bench.PAD
    trainable = {n: p.detach().clone() for n, p in b.policy.model.named_parameters()
                 if p.requires_grad}
    assert trainable and all("lora" in n for n in trainable)

    size = b.bare(b.samples)
    assert size == b.recipe.loss.micro_batch_size
    after_bare = dict(b.policy.model.named_parameters())
    assert all(torch.equal(after_bare[n], w) for n, w in trainable.items())
    assert all(p.grad is None for p in b.policy.model.parameters())

    step = b.update(b.samples)
    assert step.samples == 8 and step.tokens == sum(len(s.completion_ids) for s in b.samples)
    moved = [n for n, p in b.policy.model.named_parameters()
             if n in trainable and not torch.equal(p, trainable[n])]
    assert moved  # lora_B starts at zero; one step moves it


def test_small_run_reports_every_figure(tmp_path: Path) -> None:
    r = bench.run_shape(bench.SMALL["full1.5b"], tmp_path / "m", log=lambda _: None)
    assert r["settings"]["kind"] == "full" and r["rollouts"] == 8
    assert r["update_seconds"] > 0 and r["bare_seconds"] > 0
    assert r["ratio_update_to_bare"] == pytest.approx(r["update_seconds"] / r["bare_seconds"])
    assert r["compute_seen"]["linear_output_dtype"] == "float32"  # CPU: float32, no autocast
    assert r["settings"]["loss"]["learning_rate"] == 1e-6
    assert "ours / bare" in bench.report(r)
    json.dumps(r)  # what --json writes
