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
from conductor_engine.trainer.grpo import make_optimizer, rank_share, train_step  # noqa: E402
from tests.grpo_inputs import random_samples, tiny_model_dir  # noqa: E402

WORLD = 2
# 7 rollouts of 2 tasks in micro-batches of 3: 3 micro-batches, so one rank runs a filler
SAMPLES = {"n": 7, "seed": 4, "groups": 2, "header": 5}
LOSS = LossConfig(learning_rate=1e-3, micro_batch_size=3, loss_type="dapo")


def _policy_config(base: Path, lora: bool) -> PolicyConfig:
    return PolicyConfig(base=str(base), lora=lora, lora_r=4, device="cpu", precision="fp32")


def _update(lora: bool, base: Path, out: Path) -> dict[str, Any]:
    """One update of the tiny policy on this process (alone, or as one of the ranks); saves
    the checkpoint and the optimiser state to `out`; returns the step's metrics."""
    from conductor_engine.trainer.distributed import prepare
    from conductor_engine.trainer.policy import load_policy, save_checkpoint, save_optimizer

    torch.manual_seed(0)  # the LoRA adapter's initialisation, the same on every rank
    policy = load_policy(_policy_config(base, lora))
    policy.trained = prepare(policy.model, lora=lora)
    optimizer = make_optimizer(policy.trained, LOSS)
    step = train_step(policy.trained, optimizer, random_samples(**SAMPLES), LOSS,
                      pad_id=policy.pad_id)
    save_checkpoint(policy, out / "checkpoint")
    save_optimizer(optimizer, out / "optimizer.safetensors", model=policy.trained)
    return step.model_dump()


def _rank(rank: int, lora: bool, base: Path, out: Path, port: int) -> None:
    """One of the ranks: as torchrun starts it (its environment), then the update; rank 0's
    metrics and files go to `out`. Then the optimiser state saved is loaded into a fresh
    sharded optimiser and saved again (`resaved.safetensors`), to show it round-trips."""
    import json

    from conductor_engine.trainer.distributed import prepare, setup
    from conductor_engine.trainer.policy import load_optimizer, load_policy, save_optimizer

    os.environ.update(WORLD_SIZE=str(WORLD), RANK=str(rank), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    ranks = setup()
    assert (ranks.rank, ranks.world) == (rank, WORLD)
    metrics = _update(lora, base, out)
    if rank == 0:
        (out / "metrics.json").write_text(json.dumps(metrics))
    policy = load_policy(_policy_config(base, lora), checkpoint_dir=out / "checkpoint")
    policy.trained = prepare(policy.model, lora=lora)
    optimizer = make_optimizer(policy.trained, LOSS)
    load_optimizer(optimizer, out / "optimizer.safetensors", model=policy.trained)
    save_optimizer(optimizer, out / "resaved.safetensors", model=policy.trained)
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    want = _update(lora, base, alone)
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
    resaved = _tensors(ranked / "resaved.safetensors")
    for name, value in _tensors(ranked / "optimizer.safetensors").items():
        assert torch.equal(resaved[name], value), name


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
