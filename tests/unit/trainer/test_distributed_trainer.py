"""Training on several ranks (trainer/distributed.py): two CPU processes over gloo, as torchrun
would start them, each running `train_step` on its share of one update. The weights two ranks
end with are the weights one process gets, for LoRA (DDP) and for full fine-tuning (FSDP2), and
what rank 0 saves is the one-process checkpoint and optimiser format, which a sharded
optimiser loads back exactly."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from conductor_engine.engine.contracts.training import LossConfig, PolicyConfig  # noqa: E402
from conductor_engine.trainer.grpo import rank_share  # noqa: E402
from tests.grpo_inputs import random_samples, tiny_model_dir  # noqa: E402

WORLD = 2
# 7 rollouts of 2 tasks in micro-batches of 3: 3 micro-batches, so one rank runs a filler
SAMPLES = {"n": 7, "seed": 4, "groups": 2, "header": 5}
LOSS = LossConfig(learning_rate=1e-3, micro_batch_size=3, loss_type="dapo")


def _request(base: Path, lora: bool, precision: str = "fp32") -> Any:
    from conductor_engine.engine.contracts.training import Recipe, UpdateRequest

    policy = PolicyConfig(base=str(base), lora=lora, lora_r=4, device="cpu",
                          precision=precision)  # type: ignore[arg-type]
    return UpdateRequest(name="conductor", parent=0, update_id="u1",
                         recipe=Recipe(policy=policy, loss=LOSS))


def _update(ranks: Any, lora: bool, base: Path, out: Path, precision: str = "fp32"
            ) -> dict[str, Any]:
    """As the trainer service drives its ranks (`on_ranks`): load the policy, one update, save
    to `out`; then load that checkpoint and optimiser state again and save them to
    `out/again`, to show they round-trip. Returns the update's metrics."""
    from conductor_engine.trainer.service import on_ranks

    req = _request(base, lora, precision)
    held = on_ranks(ranks, "load", None, req, None, None)
    step = on_ranks(ranks, "train", held, req, random_samples(**SAMPLES))
    on_ranks(ranks, "save", held, out)
    again = on_ranks(ranks, "load", None, req, out / "checkpoint", out / "optimizer.safetensors")
    on_ranks(ranks, "save", again, out / "again")
    return step.model_dump()  # type: ignore[no-any-return]


def _rank(rank: int, lora: bool, base: Path, out: Path, port: int, precision: str = "fp32"
          ) -> None:
    """One of the ranks, as torchrun starts it (its environment) and `conductor trainer` runs
    it: rank 0 drives the update and writes its metrics to `out`; rank 1 follows."""
    import json

    from conductor_engine.trainer.distributed import release, setup
    from conductor_engine.trainer.service import follow

    os.environ.update(WORLD_SIZE=str(WORLD), RANK=str(rank), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if rank > 0:
        follow()
        return
    ranks = setup()
    assert (ranks.rank, ranks.world) == (0, WORLD)
    (out / "metrics.json").parent.mkdir(parents=True, exist_ok=True)
    metrics = _update(ranks, lora, base, out, precision)
    (out / "metrics.json").write_text(json.dumps(metrics))
    release()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _metadata(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata())


def _tensors(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(path))


@pytest.mark.parametrize("lora", [True, False], ids=["lora-ddp", "full-fsdp2"])
def test_one_update_on_two_ranks_gives_the_weights_of_one_process(lora: bool,
                                                                  tmp_path: Path) -> None:
    import json

    import torch.multiprocessing as mp

    base = tiny_model_dir(tmp_path / "base")
    alone, ranked = tmp_path / "alone", tmp_path / "ranked"
    want = _update(None, lora, base, alone)
    mp.spawn(_rank, args=(lora, base, ranked, _free_port()), nprocs=WORLD, join=True)
    got = json.loads((ranked / "metrics.json").read_text())

    assert got["skipped"] is None and got["tokens"] == want["tokens"] > 0
    for key in ("loss", "grad_norm", "kl", "clip_fraction"):
        assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-7), key
    files = sorted(p.name for p in (ranked / "checkpoint").iterdir())
    assert files == sorted(p.name for p in (alone / "checkpoint").iterdir())
    weights = "adapter_model.safetensors" if lora else "model.safetensors"
    one, two = (_tensors(d / "checkpoint" / weights) for d in (alone, ranked))
    assert one.keys() == two.keys()
    base_weights = _tensors(base / "model.safetensors")
    moved = 0
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-6)
        moved += name in base_weights and not torch.equal(one[name], base_weights[name])
    assert lora or moved > 0  # the update changed the full weights

    saved = _tensors(alone / "optimizer.safetensors")
    for name, value in _tensors(ranked / "optimizer.safetensors").items():
        torch.testing.assert_close(value, saved[name], rtol=1e-3, atol=1e-8)
    assert _tensors(ranked / "optimizer.safetensors").keys() == saved.keys()
    for name in (f"checkpoint/{weights}", "optimizer.safetensors"):  # loaded, saved again
        first, second = _tensors(ranked / name), _tensors(ranked / "again" / name)
        assert first.keys() == second.keys()
        for key, value in first.items():
            assert torch.equal(second[key], value), (name, key)
    metadata = [_metadata(d / "optimizer.safetensors") for d in (alone, ranked, ranked / "again")]
    assert metadata[0] == metadata[1] == metadata[2]  # hyperparameters, parameters in order


def test_full_fine_tuning_in_bf16_mixed_on_two_ranks_lands_near_one_process(tmp_path: Path
                                                                            ) -> None:
    """The path CUDA takes for 7B full fine-tuning: FSDP2 gathering the weights in bfloat16
    (MixedPrecisionPolicy) and reducing gradients in float32, the passes under autocast, the
    shared prefix packed. Its rounding is not one process's (which keeps float32 weights under
    autocast), so the update lands near it: the loss within a few percent, every weight within
    a few Adam steps of lr (1e-3), and the float32 masters saved."""
    import json

    import torch.multiprocessing as mp

    base = tiny_model_dir(tmp_path / "base")
    alone, ranked = tmp_path / "alone", tmp_path / "ranked"
    want = _update(None, False, base, alone, "bf16-mixed")
    mp.spawn(_rank, args=(False, base, ranked, _free_port(), "bf16-mixed"), nprocs=WORLD,
             join=True)
    got = json.loads((ranked / "metrics.json").read_text())
    assert got["skipped"] is None and got["tokens"] == want["tokens"] > 0
    assert got["loss"] == pytest.approx(want["loss"], rel=0.05)
    one, two = (_tensors(d / "checkpoint" / "model.safetensors") for d in (alone, ranked))
    assert one.keys() == two.keys()
    for name in one:
        assert two[name].dtype == torch.float32
        torch.testing.assert_close(two[name], one[name], rtol=0, atol=5e-3)


def test_the_ranks_share_the_micro_batches_evenly_by_tokens() -> None:
    """Every rank runs the same number of micro-batches (a collective each under FSDP2), the
    tokens about even, each micro-batch exactly once, the same split on every rank."""
    samples = random_samples(40, seed=1, groups=5, header=3)
    micro = [samples[i : i + 3] for i in range(0, 40, 3)]  # 14 micro-batches of varied size
    shares = [rank_share(micro, r, 4) for r in range(4)]
    assert {len(s) for s in shares} == {4}
    real = sorted(tuple(id(x) for x in m) for s in shares for m, w in s if w)
    assert real == sorted(tuple(id(x) for x in m) for m in micro)  # each exactly once
    assert sum(w == 0 for s in shares for _, w in s) == 2  # 16 places: two fillers
    tokens = [sum(sum(len(x.prompt_ids) + len(x.completion_ids) for x in m) for m, w in s if w)
              for s in shares]
    assert max(tokens) - min(tokens) <= max(
        sum(len(x.prompt_ids) + len(x.completion_ids) for x in m) for m in micro)
    assert rank_share(micro, 2, 4) == shares[2]
