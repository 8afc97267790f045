"""The GRPO core (trainer/grpo/) and policy checkpoints (trainer/policy.py), on a tiny random
Llama built from a config (no download): advantages, clipping, importance correction, masking,
gradient accumulation, checkpoint and optimiser round trips, and that training learns."""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conductor_engine.engine.contracts.training import LossConfig, PolicyConfig  # noqa: E402
from conductor_engine.trainer.grpo import (  # noqa: E402
    Compute,
    Reference,
    Sample,
    batch_advantages,
    collate,
    compute_of,
    group_advantages,
    grpo_loss,
    loss_normaliser,
    make_optimizer,
    per_token_logprobs,
    set_compute,
    train_step,
)
from conductor_engine.trainer.grpo._prefix import _shared_prefix_len  # noqa: E402
from tests.grpo_inputs import EOS, PAD, random_samples, tiny_model, tiny_model_dir  # noqa: E402


class GradRecorder(torch.optim.SGD):  # type: ignore[misc,name-defined]
    """An optimiser that records the gradients it is asked to apply, and applies none."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, lr=0.0)
        self.grads: list[Any] = []

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        self.grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                      for g in self.param_groups for p in g["params"]]


# ---------------------------------------------------------------------------------- advantages


def test_advantages_are_group_mean_centred() -> None:
    rewards = [0.0, 0.5, 1.0, 1.0]
    a = group_advantages(rewards, scale=False)
    assert a == pytest.approx([r - 0.625 for r in rewards])
    assert sum(a) == pytest.approx(0.0)


def test_scaled_advantages_divide_by_the_sample_std_plus_1e4_as_trl() -> None:
    rewards = [0.0, 0.5, 1.0, 1.0, 0.0]
    std = float(torch.tensor(rewards).std())  # unbiased (n - 1), as TRL's nanstd
    expected = [(r - statistics.fmean(rewards)) / (std + 1e-4) for r in rewards]
    assert group_advantages(rewards, scale=True) == pytest.approx(expected)


@pytest.mark.parametrize("scale", [True, False])
def test_a_group_of_equal_rewards_gets_zero_advantages(scale: bool) -> None:
    assert group_advantages([0.5] * 4, scale=scale) == [0.0] * 4
    assert group_advantages([1.0], scale=scale) == [0.0]



def test_batch_advantages_centre_and_scale_over_every_rollout_of_the_update() -> None:
    groups = [[0.0, 0.0, 0.0], [1.0, 0.0], [1.0, 1.0, 0.5]]
    flat = torch.tensor([r for g in groups for r in g])
    mean, std = float(flat.mean()), float(flat.std())  # unbiased, as group_advantages'
    assert batch_advantages(groups, scale=False) == [
        pytest.approx([r - mean for r in g]) for g in groups]
    assert batch_advantages(groups, scale=True) == [
        pytest.approx([(r - mean) / (std + 1e-4) for r in g]) for g in groups]
    assert all(a < 0 for a in batch_advantages(groups, scale=True)[0]), "all failed: pushed down"
    assert batch_advantages([[1.0]], scale=True) == [[0.0]], "one rollout: nothing to compare"

# ----------------------------------------------------------------------------- the surrogate


def _batch_with_ratios(ratios: list[float], advantages: list[float]) -> tuple[Any, Any]:
    """One-token samples whose ratio pi/pi_old is exactly `ratios`; log-probs as a leaf."""
    logp = [-2.0] * len(ratios)
    samples = [Sample(prompt_ids=[1], completion_ids=[2], advantage=a,
                      behaviour_logprobs=[lp - torch.log(torch.tensor(r)).item()])
               for r, a, lp in zip(ratios, advantages, logp, strict=True)]
    return torch.tensor(logp)[:, None].requires_grad_(), collate(samples, PAD)


def test_a_token_outside_the_clip_range_gets_no_gradient_in_the_clipped_direction() -> None:
    cfg = LossConfig(loss_type="dapo", epsilon_low=0.2, epsilon_high=0.28)
    # above 1 + eps_high with A > 0, below 1 - eps_low with A < 0: clipped, no gradient;
    # the same ratios with the other sign of A, and one inside the range: gradient -A r / N
    ratios = [1.5, 0.5, 1.5, 0.5, 1.1]
    advantages = [1.0, -1.0, -1.0, 1.0, 1.0]
    logp, batch = _batch_with_ratios(ratios, advantages)
    loss, metrics = grpo_loss(logp, batch, cfg)
    loss.backward()
    expected = [0.0, 0.0, 1.5 / 5, -0.5 / 5, -1.1 / 5]
    assert logp.grad[:, 0].tolist() == pytest.approx(expected, abs=1e-6)
    assert metrics["clip_high"] == pytest.approx(1 / 5)
    assert metrics["clip_low"] == pytest.approx(1 / 5)
    assert metrics["clip_fraction"] == pytest.approx(2 / 5)
    assert metrics["ratio"] == pytest.approx(sum(ratios) / 5)


def test_the_importance_ratio_uses_the_behaviour_logprobs_when_the_trace_has_them() -> None:
    cfg = LossConfig(loss_type="dapo")
    logp = torch.tensor([[-1.0, -2.0], [-1.0, -2.0]], requires_grad=True)
    samples = [Sample(prompt_ids=[1], completion_ids=[2, 3], advantage=1.0,
                      behaviour_logprobs=[-1.1, -2.1]),  # pi/pi_old = e^0.1 on both tokens
               Sample(prompt_ids=[1], completion_ids=[2, 3], advantage=1.0)]  # no record: r = 1
    loss, metrics = grpo_loss(logp, collate(samples, PAD), cfg)
    loss.backward()
    r = torch.exp(torch.tensor(0.1)).item()
    torch.testing.assert_close(logp.grad, torch.tensor([[-r / 4, -r / 4], [-1 / 4, -1 / 4]]))
    assert metrics["ratio"] == pytest.approx((2 * r + 2) / 4)
    assert metrics["kl"] == pytest.approx(2 * (r - 1 - 0.1) / 4, rel=1e-4)  # KL(pi_old || pi)


def test_truncated_completions_are_dropped_from_the_loss_when_masked() -> None:
    samples = random_samples(4, truncated=1)
    for mask in (True, False):
        cfg = LossConfig(loss_type="dapo", mask_truncated=mask)
        logp = torch.full((4, max(len(s.completion_ids) for s in samples)), -3.0,
                          requires_grad=True)
        loss, metrics = grpo_loss(logp, collate(samples, PAD), cfg)
        loss.backward()
        assert (logp.grad[3] == 0).all() == mask
        kept = samples[:3] if mask else samples
        assert metrics["tokens"] == sum(len(s.completion_ids) for s in kept)
        assert loss_normaliser(samples, cfg) == metrics["tokens"]


def test_tokens_a_grammar_forced_stay_out_of_the_loss_but_are_still_read() -> None:
    """A forced token's probability under the grammar is 1: no gradient, no count, and the
    tokens around it score exactly as without the flag (it is still context)."""
    model = tiny_model()
    samples = random_samples(3, old=False, groups=1, completion_len=(6, 8))
    flags = [[k % 3 == 0 for k in range(len(s.completion_ids))] for s in samples]
    forced = [dataclasses.replace(s, forced=f) for s, f in zip(samples, flags, strict=True)]
    cfg = LossConfig(loss_type="dapo")

    plain = per_token_logprobs(model, collate(samples, PAD))
    got = per_token_logprobs(model, collate(forced, PAD))
    keep = collate(forced, PAD).loss_mask.bool()
    assert not keep.all() and (got[~keep] == 0).all()
    torch.testing.assert_close(got[keep], plain[keep], rtol=1e-5, atol=1e-6)

    loss, metrics = grpo_loss(got, collate(forced, PAD), cfg)
    trained = sum(f.count(False) for f in flags)
    assert metrics["tokens"] == trained == loss_normaliser(forced, cfg)
    assert sum(s.trained_tokens for s in forced) == trained
    # the same loss as scoring the unflagged tokens alone, token by token
    adv = torch.tensor([s.advantage for s in samples])[:, None]
    expected = -(adv * keep).sum() / trained  # on-policy: ratio 1, so l = -A per token
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_a_sample_with_the_wrong_number_of_forced_flags_is_refused() -> None:
    with pytest.raises(ValueError, match="2 forced flags for 3 completion tokens"):
        Sample(prompt_ids=[1], completion_ids=[2, 3, 4], advantage=1.0, forced=[True, False])


# --------------------------------------------------------------------------------- log-probs


def full_pass_logprobs(model: Any, samples: list[Sample], temperature: float) -> Any:
    """Each sample's completion log-probs from its own full forward pass, padded to [B, T]."""
    rows = []
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        logits = model(input_ids=ids).logits[0, len(s.prompt_ids) - 1 : -1] / temperature
        rows.append(logits.log_softmax(-1).gather(-1, ids[0, len(s.prompt_ids) :, None])[:, 0])
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)


@pytest.mark.parametrize(("groups", "header"), [(0, 0), (1, 0), (0, 12), (2, 9)],
                         ids=["own-prompts", "one-shared-prompt", "one-shared-header",
                              "two-groups-one-header"])
@pytest.mark.parametrize("completion_len", [(2, 9), (1, 1)], ids=["varied", "one-token"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["kept", "checkpointed"])
@pytest.mark.parametrize("prefix", ["cache", "packed"])
def test_per_token_logprobs_and_gradients_equal_separate_full_passes(
    groups: int, header: int, completion_len: tuple[int, int], checkpointing: bool, prefix: str
) -> None:
    """Also when the prefix all prompts share (a group's whole prompt, or the instructions
    prompts of different lengths open with) runs once and the rows read it as a KV cache, or
    packed into one sequence with the rows (as under FSDP2), and also under gradient
    checkpointing, where the rows' pass is recomputed in the backward (each decoder layer's
    MLP then runs once more) and still reads the prefix's cache."""
    model = tiny_model().train()
    if checkpointing:
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False})
    mlp_calls = [0]
    act = model.model.layers[0].mlp.act_fn
    run = act.forward  # counted by hand: module hooks do not fire in a checkpoint's recompute

    def counted(x: Any) -> Any:
        mlp_calls[0] += 1
        return run(x)

    act.forward = counted
    samples = random_samples(5, groups=groups, completion_len=completion_len, header=header)
    batch = collate(samples, PAD)
    batch.prefix = prefix
    shared = _shared_prefix_len(model, batch)
    assert shared == (min(len(s.prompt_ids) for s in samples) - 1 if groups == 1 else header)
    got = per_token_logprobs(model, batch, temperature=0.7)
    got.sum().backward()
    passes = 2 if shared and prefix == "cache" else 1  # the prefix, then the rows; or one
    assert mlp_calls[0] == passes + (1 if checkpointing else 0)  # the rows' pass, recomputed
    fast = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    want = full_pass_logprobs(model, samples, 0.7)
    want.sum().backward()

    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g, w in zip(fast, [p.grad for p in model.parameters()], strict=True):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-5)


def with_choices(samples: list[Sample], seed: int = 0) -> list[Sample]:
    """The samples with every other completion token a choice among a few tokens (its own and
    2 to 5 others), as a plan grammar leaves at an agent or access."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in samples:
        choices = {}
        for k in range(0, len(s.completion_ids), 2):
            others = torch.randperm(PAD, generator=g)[: 2 + k % 4].tolist()
            choices[k] = sorted({s.completion_ids[k], *others})
        out.append(dataclasses.replace(s, choices=choices))
    return out


@pytest.mark.parametrize("groups", [0, 1], ids=["own-prompts", "one-shared-prompt"])
def test_a_choice_is_scored_over_the_tokens_its_grammar_allowed(groups: int) -> None:
    """At a choice, log pi = z[token] - logsumexp(z[allowed]): the distribution the grammar-
    constrained sampler drew from; elsewhere the whole vocabulary, as before. Gradients match
    the hand-written renormalisation, so no gradient reaches a token the grammar ruled out."""
    model = tiny_model()
    samples = with_choices(random_samples(4, groups=groups, completion_len=(3, 7)))
    got = per_token_logprobs(model, collate(samples, PAD), temperature=0.7)
    got.sum().backward()
    fast = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    rows = []
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        z = model(input_ids=ids).logits[0, len(s.prompt_ids) - 1 : -1] / 0.7
        lp = z.log_softmax(-1).gather(-1, ids[0, len(s.prompt_ids):, None])[:, 0]
        for k, allowed in (s.choices or {}).items():
            lp = lp.clone()
            lp[k] = z[k, s.completion_ids[k]] - torch.logsumexp(z[k, allowed], 0)
        rows.append(lp)
    want = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
    want.sum().backward()

    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    plain = per_token_logprobs(model, collate(random_samples(4, groups=groups,
                                                             completion_len=(3, 7)), PAD),
                               temperature=0.7)
    assert not torch.allclose(got[:, ::2], plain[:, ::2])  # renormalised: higher than plain
    for g, w in zip(fast, [p.grad for p in model.parameters()], strict=True):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-5)


def test_a_choice_that_does_not_hold_the_sampled_token_is_refused() -> None:
    with pytest.raises(ValueError, match="choice at completion token 1 does not hold"):
        Sample(prompt_ids=[1], completion_ids=[2, 3], advantage=1.0, choices={1: [4, 5]})


# -------------------------------------------------------------------------- gradient accumulation


@pytest.mark.parametrize("groups", [0, 2], ids=["own-prompts", "two-groups"])
@pytest.mark.parametrize("beta", [0.0, 0.05])
@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_micro_batches_accumulate_to_the_full_batch_gradient(loss_type: str, beta: float,
                                                            groups: int) -> None:
    samples = random_samples(7, seed=1, truncated=1, zero=1, groups=groups)
    cfg = LossConfig.model_validate(dict(loss_type=loss_type, beta=beta, mask_truncated=True,
                                         epsilon_high=0.28, max_completion_length=16))
    # in float64: what is compared is the accumulation's arithmetic, not float32's rounding
    # (summed in another order, a near-zero gradient element of the float32 model moved by
    # 1.5e-6, over the tolerance; in float64 the largest difference is about 2e-8)
    ref = Reference(tiny_model(seed=7).double()) if beta else None

    # the whole batch in one pass, written out by hand
    model = tiny_model().double()
    batch = collate(samples, PAD)
    ref_logp = per_token_logprobs(ref.model, batch).detach() if ref is not None else None
    loss, _ = grpo_loss(per_token_logprobs(model, batch), batch, cfg, ref_logprobs=ref_logp)
    loss.backward()
    full = [p.grad for p in model.parameters()]

    for micro in (1, 3):
        model = tiny_model().double()
        recorder = GradRecorder(model.parameters())
        step = train_step(model, recorder, samples,
                          cfg.model_copy(update={"micro_batch_size": micro, "max_grad_norm": 1e9}),
                          ref_model=ref, pad_id=PAD)
        assert step.skipped is None and step.loss == pytest.approx(loss.item(), rel=1e-5)
        for got, want in zip(recorder.grads, full, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["kept", "checkpointed"])
@pytest.mark.parametrize("header", [0, 6], ids=["own-prompts", "one-header"])
def test_a_group_over_several_micro_batches_runs_its_prompt_once_to_the_same_gradient(
        checkpointing: bool, header: int) -> None:
    """Two groups of 6 in micro-batches of 2: each group's prompt runs forward twice and
    backward once in all (GroupPrefix), not once per micro-batch, and the update's gradient is
    the one of a single pass over all the rows, written out by hand (float64)."""
    samples = random_samples(12, seed=3, old=True, groups=2, header=header)
    cfg = LossConfig(micro_batch_size=2, max_grad_norm=1e9)

    model = tiny_model().double()
    batch = collate(samples, PAD)
    batch.prefix = "none"
    loss, _ = grpo_loss(per_token_logprobs(model, batch), batch, cfg)
    loss.backward()
    want = [p.grad for p in model.parameters()]

    model = tiny_model().double()
    if checkpointing:
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False})
    passes: list[int] = []  # rows per forward pass of the first decoder layer
    model.model.layers[0].register_forward_pre_hook(
        lambda _, args, kwargs: passes.append(kwargs["hidden_states"].shape[0]
                                              if "hidden_states" in kwargs else args[0].shape[0]),
        with_kwargs=True)
    recorder = GradRecorder(model.parameters())
    step = train_step(model, recorder, samples, cfg, pad_id=PAD)
    assert step.skipped is None and step.loss == pytest.approx(loss.item(), rel=1e-6)
    prompts = [p for p in passes if p == 1]  # a prefix pass is one row; the rows' passes two
    assert len(prompts) == 2 * 2, passes  # per group: once without gradients, once with
    assert len(passes) - len(prompts) == 6, passes  # six micro-batches of rows
    for got, w in zip(recorder.grads, want, strict=True):
        torch.testing.assert_close(got, w, rtol=1e-4, atol=1e-6)  # log-probs are float32


@pytest.mark.parametrize("checkpointing", [False, True], ids=["kept", "checkpointed"])
@pytest.mark.parametrize(("shared", "header"), [(True, 16), (False, 16), (True, 2)],
                         ids=["update-prefix", "per-micro-batch", "own-prompts-kept"])
def test_the_opening_every_prompt_of_an_update_shares_runs_once_to_the_same_gradient(
        checkpointing: bool, shared: bool, header: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four groups of two behind one 16-token header (the conductor's instructions), a group a
    micro-batch: each micro-batch opens with its own prompt, and the header they all share
    runs forward twice and backward once for the whole update (SHARE_UPDATE_PREFIX), not once
    per micro-batch; the gradient is the one of a single pass over all the rows (float64).
    Behind a 2-token header each group keeps running its own prompt once: the rows running
    their prompts after the header would cost more than the header saves."""
    from conductor_engine.trainer.grpo import _prefix

    monkeypatch.setattr(_prefix, "SHARE_UPDATE_PREFIX", shared)
    samples = random_samples(8, seed=5, old=True, header=header, groups=4)
    cfg = LossConfig(micro_batch_size=2, max_grad_norm=1e9)

    model = tiny_model().double()
    batch = collate(samples, PAD)
    batch.prefix = "none"
    loss, _ = grpo_loss(per_token_logprobs(model, batch), batch, cfg)
    loss.backward()
    want = [p.grad for p in model.parameters()]

    model = tiny_model().double()
    if checkpointing:
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False})
    passes: list[int] = []  # rows per forward pass of the first decoder layer
    model.model.layers[0].register_forward_pre_hook(
        lambda _, args, kwargs: passes.append(kwargs["hidden_states"].shape[0]
                                              if "hidden_states" in kwargs else args[0].shape[0]),
        with_kwargs=True)
    recorder = GradRecorder(model.parameters())
    step = train_step(model, recorder, samples, cfg, pad_id=PAD)
    assert step.skipped is None and step.loss == pytest.approx(loss.item(), rel=1e-6)
    prompts = [p for p in passes if p == 1]  # a prefix pass is one row; the rows' passes two
    once = shared and header > 2
    assert len(prompts) == (2 if once else 4), passes  # once for all, or per micro-batch
    assert len(passes) - len(prompts) == 4, passes  # four micro-batches of rows
    for got, w in zip(recorder.grads, want, strict=True):
        torch.testing.assert_close(got, w, rtol=1e-4, atol=1e-6)  # log-probs are float32


def test_a_step_where_every_advantage_is_zero_is_skipped() -> None:
    model = tiny_model()
    before = [p.detach().clone() for p in model.parameters()]
    samples = random_samples(4, zero=4)
    step = train_step(model, make_optimizer(model, LossConfig(learning_rate=0.1)), samples,
                      LossConfig(), pad_id=PAD)
    assert step.skipped and step.samples == 4 and step.tokens == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_train_steps_raise_the_logprob_of_positive_advantage_completions() -> None:
    model = tiny_model()
    prompt = [5, 6, 7]
    completions = [[10, 11, 12, EOS], [13, 14, EOS], [20, 21, 22, 23, EOS], [24, EOS]]
    advantages = group_advantages([1.0, 1.0, 0.0, 0.0], scale=True)
    samples = [Sample(prompt_ids=prompt, completion_ids=c, advantage=a)
               for c, a in zip(completions, advantages, strict=True)]
    batch = collate(samples, PAD)

    def mean_logp() -> Any:
        with torch.no_grad():
            lp = per_token_logprobs(model, batch)
        return (lp * batch.completion_mask).sum(-1) / batch.completion_mask.sum(-1)

    before = mean_logp()
    cfg = LossConfig(learning_rate=1e-2, micro_batch_size=2)
    optimizer = make_optimizer(model, cfg)
    for _ in range(5):
        step = train_step(model, optimizer, samples, cfg, pad_id=PAD)
        assert step.skipped is None and step.tokens == 14 and step.grad_norm > 0
    change = mean_logp() - before
    assert (change[:2] > 0.1).all() and (change[2:] < -0.1).all(), change


@pytest.mark.parametrize("old", [True, False], ids=["behaviour-logprobs", "none-recorded"])
def test_later_steps_of_an_update_are_clipped_against_the_policy_that_sampled(old: bool) -> None:
    """steps_per_update = 2 is one step, then one whose ratio is measured against the sampling
    policy: the recorded behaviour log-probs, or where none were recorded, the policy before the
    first step (not the moving one, which would make every ratio 1 and nothing clipped)."""
    samples = random_samples(6, seed=3, old=old, groups=2)
    cfg = LossConfig(learning_rate=5e-2, micro_batch_size=4)

    model = tiny_model()
    update = train_step(model, make_optimizer(model, cfg), samples,
                        cfg.model_copy(update={"steps_per_update": 2}), pad_id=PAD)
    assert update.skipped is None and update.steps == 2 and update.clip_fraction > 0

    by_hand = tiny_model()
    optimizer = make_optimizer(by_hand, cfg)
    second = samples
    if not old:
        with torch.no_grad():
            sampled = per_token_logprobs(by_hand, collate(samples, PAD))
        second = [dataclasses.replace(s, behaviour_logprobs=sampled[i, :len(s.completion_ids)]
                                      .tolist()) for i, s in enumerate(samples)]
    train_step(by_hand, optimizer, samples, cfg, pad_id=PAD)
    train_step(by_hand, optimizer, second, cfg, pad_id=PAD)
    for got, want in zip(model.parameters(), by_hand.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------ precision


def test_bf16_mixed_updates_at_lr_1e6_move_the_float32_weights_that_bf16_weights_would_lose(
) -> None:
    """Mixed precision: the passes run in bfloat16 (autocast), the weights and AdamW state stay
    float32, and an update at the paper's 1e-6 moves almost every weight it has a gradient for
    by ~1e-6 (Adam's first step is lr * sign(g)). The same update on bfloat16 weights is lost:
    their spacing near the weights' scale (0.2) is 2^-10, and 1e-6 rounds back to the weight.
    That is why weights stay float32 and only the compute is bfloat16."""
    samples = random_samples(6, seed=2, old=False, groups=2)
    cfg = LossConfig(learning_rate=1e-6)

    def moved(model: Any) -> tuple[float, float]:
        """(share of weights with a gradient that moved, the largest move)"""
        before = [p.detach().float().clone() for p in model.parameters()]
        optimizer = make_optimizer(model, cfg)
        grads: list[Any] = []
        optimizer.register_step_pre_hook(
            lambda opt, *_: grads.extend(p.grad.clone() for p in opt.param_groups[0]["params"]))
        assert train_step(model, optimizer, samples, cfg, pad_id=PAD).skipped is None
        live = [g != 0 for g in grads]
        changed = sum(int(((p.detach().float() != b) & m).sum())
                      for p, b, m in zip(model.parameters(), before, live, strict=True))
        largest = max(float((p.detach().float() - b).abs().max())
                      for p, b in zip(model.parameters(), before, strict=True))
        return changed / sum(int(m.sum()) for m in live), largest

    mixed = tiny_model()
    set_compute(mixed, Compute(autocast=torch.bfloat16))
    batch = collate(samples, PAD)
    with torch.no_grad():
        plain = per_token_logprobs(mixed, batch)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = per_token_logprobs(mixed, batch)
    assert 0 < float((plain - low).abs().max()) < 0.1  # the passes do run in bfloat16
    share, largest = moved(mixed)
    assert next(mixed.parameters()).dtype == torch.float32
    assert share > 0.95 and largest == pytest.approx(1e-6, rel=0.05), (share, largest)

    share, _ = moved(tiny_model().to(torch.bfloat16))  # pure bfloat16 weights
    assert share < 0.02, share


def test_auto_checkpointing_leaves_the_paper_lora_shape_unchecked_on_an_80gb_gpu() -> None:
    """The shapes decide (gradient_checkpointing = None): 7B LoRA's longest micro-batch of 8
    paper rollouts (a 900-token prompt run once, 400-token completions) is estimated at ~48 GB
    of activations, which fits beside the bfloat16 base and the adapter's state on an 80 GB
    GPU, so it runs without recomputation (issue 31: 20.8 s per update, not 62.7 s); 7B full
    weights sharded on two such GPUs (~61 GB each) leave no room for it, so those recompute."""
    from types import SimpleNamespace

    from conductor_engine.trainer.grpo import fits
    from conductor_engine.trainer.grpo._memory import _bytes_per_token

    qwen7b = SimpleNamespace(config=SimpleNamespace(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28))
    per_token = _bytes_per_token(qwen7b, compute=2, stream=2, lora=True)  # a bf16 base
    activations = (900 + 8 * 400) * per_token
    assert 38 * 2**30 < activations < 56e9  # above issue 31's measured peak, not far above
    gpu = 80 * 2**30
    adapter = 161_000_000 * 4  # r=64 all-linear, float32; its gradients and AdamW state, x3
    assert fits(activations + 3 * adapter, gpu - 15_200_000_000 - adapter)
    full_shard = 7_600_000_000 * 16 // 2  # float32 weights, gradients and AdamW, halved
    assert not fits(activations, gpu - full_shard)  # the prefix packed once, as on one GPU


@pytest.mark.parametrize(("autocast", "lora_dropout"), [
    (None, None), (torch.bfloat16, None), (torch.bfloat16, 0.0), (torch.bfloat16, 0.05)],
    ids=["fp32", "bf16-mixed", "lora-bf16-base", "lora-dropout"])
def test_the_activation_estimate_is_above_what_autograd_keeps_and_within_twice_it(
        autocast: Any, lora_dropout: float | None) -> None:
    """Auto checkpointing decides from an estimate until it has measured a micro-batch; the
    estimate must not be below what a pass really keeps (it would run out of memory), nor so
    far above that it recomputes where nothing needs it. With LoRA as on CUDA: the frozen base
    in bfloat16, the adapter on every linear layer in float32, the passes under autocast."""
    from conductor_engine.trainer.grpo._compute import _hf
    from conductor_engine.trainer.grpo._memory import _measure, _per_token

    model = tiny_model(hidden=256, layers=2).train()
    if lora_dropout is not None:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model.to(torch.bfloat16), LoraConfig(
            r=16, lora_alpha=32, lora_dropout=lora_dropout, target_modules="all-linear"))
        assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}
    batch = collate(random_samples(8, groups=2, completion_len=(20, 40), header=30), PAD)
    compute = Compute(autocast=autocast)
    estimate = _per_token(_hf(model), compute)
    with _measure(model, batch, compute, True):
        with torch.autocast("cpu", dtype=autocast or torch.float32, enabled=bool(autocast)):
            logprobs = per_token_logprobs(model, batch)
        logprobs.sum().backward()
    kept = compute.measured["bytes_per_token"]
    assert kept < estimate < 2 * kept, (kept, estimate)


def _tiny_qwen2_dir(out: Path) -> Path:
    """A random Qwen2 (Qwen2.5's architecture: q/k/v biases, untied head) saved with the tiny
    tokenizer, as a model directory."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tests.grpo_inputs import tiny_tokenizer

    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(
        vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
        pad_token_id=PAD, eos_token_id=EOS)).save_pretrained(out)
    tiny_tokenizer().save_pretrained(out)
    return out


@pytest.mark.parametrize("recompute", [False, True], ids=["not-recomputed", "recomputed"])
def test_qwen2_with_checkpointing_installed_runs_the_shared_prefix_as_full_passes(
        recompute: bool, tmp_path: Path) -> None:
    """On CUDA load_policy installs checkpointing and train_step turns it on per micro-batch
    only where memory needs it. Qwen2 then ignores use_cache (it returns no cache from the
    prefix pass, whichever way the layers are set): the shared prefix must still give the
    log-probs and gradients of full passes, recomputed or not."""
    from conductor_engine.trainer.grpo._compute import _checkpointed, _hf
    from conductor_engine.trainer.policy import load_policy

    policy = load_policy(PolicyConfig(base=str(_tiny_qwen2_dir(tmp_path)), lora=False,
                                      device="cpu", gradient_checkpointing=True))
    model = policy.model.train()
    batch = collate(random_samples(4, seed=5, groups=1, header=6), PAD)
    assert _shared_prefix_len(_hf(model), batch) > 0

    def run(prefix: str) -> tuple[Any, list[Any]]:
        with _checkpointed(_hf(model), recompute):
            logprobs = per_token_logprobs(model, dataclasses.replace(batch, prefix=prefix))
        logprobs.sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        return logprobs.detach(), grads

    shared, shared_grads = run("cache")
    full, full_grads = run("none")
    torch.testing.assert_close(shared, full, rtol=1e-4, atol=1e-5)
    for a, b in zip(shared_grads, full_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)


def _oom_run(base: Path, samples: list[Sample], cfg: LossConfig, *, oom_from: int | None,
             oom_until: int | None = None) -> tuple[Any, Any, list[bool]]:
    """A full policy under auto checkpointing, updated by SGD (whose step is proportional to
    the gradient: a micro-batch counted twice would show), its first decoder layer raising
    CUDA's out-of-memory error on forward calls oom_from..oom_until (as a GPU would)."""
    from conductor_engine.trainer.grpo import decoder_layers
    from conductor_engine.trainer.policy import load_policy

    policy = load_policy(PolicyConfig(base=str(base), lora=False, device="cpu",
                                      gradient_checkpointing=True))
    set_compute(policy.model, Compute(auto_checkpointing=True))
    calls: list[bool] = []  # each forward call of the layer: was it checkpointed

    def layer_forward(layer: Any, _: Any) -> None:
        calls.append(layer.gradient_checkpointing)
        if oom_from is not None and oom_from <= len(calls) <= (oom_until or oom_from):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    decoder_layers(policy.model)[0].register_forward_pre_hook(layer_forward)
    optimizer = torch.optim.SGD(policy.model.parameters(), lr=cfg.learning_rate)
    return policy.model, train_step(policy.model, optimizer, samples, cfg, pad_id=PAD), calls


def test_a_micro_batch_out_of_memory_reruns_the_step_checkpointed_to_the_same_weights(
        tmp_path: Path) -> None:
    """The third forward (the second micro-batch's prefix, after the first micro-batch's
    gradients were accumulated) runs out of memory: the step runs again, checkpointed, and
    ends where an update that never ran out ends (nothing accumulated twice)."""
    base = tiny_model_dir(tmp_path)
    samples = random_samples(8, seed=4, old=False, groups=2, header=5)
    cfg = LossConfig(learning_rate=1e-1, micro_batch_size=2)
    want, want_step, plain = _oom_run(base, samples, cfg, oom_from=None)
    got, got_step, calls = _oom_run(base, samples, cfg, oom_from=3)
    assert not any(plain) and any(calls[3:]), calls  # the rerun recomputed; nothing before
    assert got_step.skipped is None
    assert (got_step.loss, got_step.tokens) == pytest.approx((want_step.loss, want_step.tokens))
    for a, b in zip(got.parameters(), want.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_out_of_memory_with_every_micro_batch_checkpointed_says_to_lower_the_micro_batch(
        tmp_path: Path) -> None:
    samples = random_samples(8, seed=4, old=False, groups=2, header=5)
    with pytest.raises(torch.OutOfMemoryError, match=r"lower \[loss\] micro_batch_size"):
        _oom_run(tiny_model_dir(tmp_path), samples, LossConfig(micro_batch_size=2), oom_from=3,
                 oom_until=10**6)


def test_load_policy_sets_bf16_mixed_compute_over_float32_weights(tmp_path: Path) -> None:
    from conductor_engine.trainer.policy import load_policy

    base = str(tiny_model_dir(tmp_path))
    for lora in (True, False):
        policy = load_policy(PolicyConfig(base=base, lora=lora, lora_r=4, device="cpu",
                                          precision="bf16-mixed"))
        assert compute_of(policy.model) == Compute(autocast=torch.bfloat16)
        assert {p.dtype for p in policy.model.parameters() if p.requires_grad} == {torch.float32}
    policy = load_policy(PolicyConfig(base=base, device="cpu"))  # None on CPU: float32
    assert compute_of(policy.model) == Compute(autocast=None)


def test_a_lora_adapter_over_a_bfloat16_base_stays_float32_new_and_continued(tmp_path: Path
                                                                            ) -> None:
    """As on CUDA: the frozen base in bfloat16, the adapter (what AdamW, fused there, steps)
    in float32, whether new or continued from a saved checkpoint; an update under bf16-mixed
    moves it."""
    from conductor_engine.trainer.policy import load_policy, save_checkpoint

    cfg = PolicyConfig(base=str(tiny_model_dir(tmp_path / "base")), lora_r=4, device="cpu",
                       bf16=True, precision="bf16-mixed")
    policy = load_policy(cfg)
    for _ in range(2):
        model = policy.model
        assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}
        assert {p.dtype for p in model.parameters() if not p.requires_grad} == {torch.bfloat16}
        before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
        loss = LossConfig(learning_rate=1e-3)
        step = train_step(model, make_optimizer(model, loss), random_samples(4), loss)
        assert step.skipped is None
        assert any(not torch.equal(b, p) for b, p in zip(
            before, (p for p in model.parameters() if p.requires_grad), strict=True))
        save_checkpoint(policy, tmp_path / "adapter")
        policy = load_policy(cfg, checkpoint_dir=tmp_path / "adapter")


# ------------------------------------------------------------------------------ checkpoints


def test_the_lora_reference_is_the_base_model(tmp_path: Path) -> None:
    """beta > 0 with a LoRA policy: the reference is the policy with its adapter disabled, so the
    KL starts at 0 (a new adapter changes nothing) and grows as the adapter trains."""
    from conductor_engine.trainer.policy import load_policy, reference_model

    policy = load_policy(PolicyConfig(base=str(tiny_model_dir(tmp_path)), lora_r=4, device="cpu"))
    ref = reference_model(policy)
    assert ref.model is policy.model and ref.adapter is None
    cfg = LossConfig(beta=0.1, learning_rate=1e-2)
    optimizer = make_optimizer(policy.model, cfg)
    samples = random_samples(4, old=False)
    kls = [train_step(policy.model, optimizer, samples, cfg, ref_model=ref).kl for _ in range(3)]
    assert kls[0] == pytest.approx(0.0, abs=1e-7) and kls[2] > 1e-4, kls
    assert all(p.grad is None for p in policy.model.parameters())  # zeroed after the step


def test_a_lora_reference_version_is_that_versions_policy_and_leaves_the_adapter_as_it_was(
        tmp_path: Path) -> None:
    """The warm-up's version as the KL's reference (UpdateRequest.reference): GRPO continuing
    from it starts at KL 0, where the base reference would not; under `active()` the policy
    scores exactly as that version loaded on its own, and after it the policy's own adapter is
    back, bit for bit, and still trains. An adapter of another LoRA shape is refused."""
    from conductor_engine.trainer.policy import load_policy, reference_model, save_checkpoint

    cfg = PolicyConfig(base=str(tiny_model_dir(tmp_path / "base")), lora_r=4, device="cpu")
    warm = load_policy(cfg)
    sft = LossConfig(learning_rate=3e-2)
    optimizer = make_optimizer(warm.model, sft)
    samples = random_samples(4, old=False)
    for _ in range(3):  # the warm-up moves the adapter away from the base
        train_step(warm.model, optimizer, samples, sft)
    save_checkpoint(warm, tmp_path / "v1")

    policy = load_policy(cfg, checkpoint_dir=tmp_path / "v1")  # GRPO continues from v1
    grpo = LossConfig(beta=0.1, learning_rate=1e-2)
    base_kl = train_step(policy.model, make_optimizer(policy.model, grpo), samples, grpo,
                         ref_model=reference_model(policy)).kl  # the KL before the step's update
    assert base_kl > 1e-4, "the warm-up moved the policy: the base is not where it starts"

    policy = load_policy(cfg, checkpoint_dir=tmp_path / "v1")  # again, before that step
    ref = reference_model(policy, cfg, tmp_path / "v1")
    optimizer = make_optimizer(policy.model, grpo)
    kls = [train_step(policy.model, optimizer, samples, grpo, ref_model=ref).kl
           for _ in range(3)]
    assert kls[0] == pytest.approx(0.0, abs=1e-7) and kls[2] > 1e-5, kls

    own = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    batch = collate(samples, PAD)
    alone = load_policy(cfg, checkpoint_dir=tmp_path / "v1").model.eval()
    with torch.no_grad(), ref.active() as as_ref:
        torch.testing.assert_close(per_token_logprobs(as_ref.eval(), batch),
                                   per_token_logprobs(alone, batch), rtol=0, atol=1e-6)
    for n, p in policy.model.named_parameters():
        assert torch.equal(p, own[n]), n
    assert all(p.requires_grad for n, p in policy.model.named_parameters() if "lora_" in n)

    other = load_policy(cfg.model_copy(update={"lora_r": 8}))
    with pytest.raises(ValueError, match="does not fit the policy's"):
        reference_model(other, cfg, tmp_path / "v1")


def test_a_full_reference_version_is_that_versions_weights_frozen(tmp_path: Path) -> None:
    """Full fine-tuning: the reference version is its checkpoint loaded apart, frozen, so GRPO
    continuing from it starts at KL 0 and the reference takes no update."""
    from conductor_engine.trainer.policy import load_policy, reference_model, save_checkpoint

    cfg = PolicyConfig(base=str(tiny_model_dir(tmp_path / "base")), lora=False, device="cpu")
    warm = load_policy(cfg)
    samples = random_samples(4, old=False)
    train_step(warm.model, make_optimizer(warm.model, LossConfig(learning_rate=1e-2)), samples,
               LossConfig(learning_rate=1e-2))
    save_checkpoint(warm, tmp_path / "v1")
    policy = load_policy(cfg, checkpoint_dir=tmp_path / "v1")
    ref = reference_model(policy, cfg, tmp_path / "v1")
    assert ref.model is not policy.model and not any(p.requires_grad
                                                     for p in ref.model.parameters())
    grpo = LossConfig(beta=0.1, learning_rate=1e-2)
    optimizer = make_optimizer(policy.model, grpo)
    kls = [train_step(policy.model, optimizer, samples, grpo, ref_model=ref).kl
           for _ in range(3)]
    assert kls[0] == pytest.approx(0.0, abs=1e-7) and kls[2] > 1e-5, kls



@pytest.mark.parametrize("lora", [True, False])
def test_a_saved_checkpoint_loads_back_with_identical_logprobs(lora: bool, tmp_path: Path
                                                               ) -> None:
    from conductor_engine.trainer.policy import (
        load_optimizer,
        load_policy,
        save_checkpoint,
        save_optimizer,
    )

    cfg = PolicyConfig(base=str(tiny_model_dir(tmp_path / "base")), lora=lora, lora_r=4,
                       device="cpu")
    policy = load_policy(cfg)
    assert policy.kind == ("lora" if lora else "full") and policy.pad_id == PAD
    loss_cfg = LossConfig(learning_rate=1e-2)
    optimizer = make_optimizer(policy.model, loss_cfg)
    train_step(policy.model, optimizer, random_samples(4), loss_cfg)
    save_optimizer(optimizer, tmp_path / "optimizer.safetensors")
    batch = collate(random_samples(4, seed=3), policy.pad_id)
    with torch.no_grad():
        trained = per_token_logprobs(policy.model, batch)
        base = per_token_logprobs(load_policy(cfg).model, batch)
    assert not torch.allclose(trained, base)  # the step changed the policy

    files = save_checkpoint(policy, tmp_path / "ckpt")
    expected = ({"adapter_model.safetensors", "adapter_config.json"} if lora else
                {"model.safetensors", "config.json", "generation_config.json"})
    assert {f.name for f in files} == expected

    loaded = load_policy(cfg, checkpoint_dir=tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(per_token_logprobs(loaded.model, batch), trained)
    assert any(p.requires_grad for p in loaded.model.parameters())  # trainable again
    # the optimiser state lines up with the reloaded policy's parameters, one for one
    restored = make_optimizer(loaded.model, loss_cfg)
    load_optimizer(restored, tmp_path / "optimizer.safetensors")
    for p in restored.param_groups[0]["params"]:
        assert restored.state[p]["exp_avg"].shape == p.shape


def test_the_optimizer_state_survives_a_save_and_load(tmp_path: Path) -> None:
    from conductor_engine.trainer.policy import load_optimizer, save_optimizer

    cfg = LossConfig(learning_rate=1e-2)
    model = tiny_model()
    optimizer = make_optimizer(model, cfg)
    for seed in range(2):
        train_step(model, optimizer, random_samples(4, seed=seed), cfg, pad_id=PAD)
    save_optimizer(optimizer, tmp_path / "optimizer.safetensors")

    restored_model = tiny_model()
    restored_model.load_state_dict(model.state_dict())
    restored = make_optimizer(restored_model, cfg)
    load_optimizer(restored, tmp_path / "optimizer.safetensors")
    assert restored.state_dict()["param_groups"] == optimizer.state_dict()["param_groups"]

    samples = random_samples(4, seed=5)
    train_step(model, optimizer, samples, cfg, pad_id=PAD)
    train_step(restored_model, restored, samples, cfg, pad_id=PAD)
    for a, b in zip(model.parameters(), restored_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.slow
def test_the_local_default_trains_and_its_adapter_is_what_the_engine_serves(
        smollm2_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SmolLM2-135M-Instruct (the engine's converted cache) as a LoRA policy: one step, saved,
    then loaded by the local provider as a published version (adapter merged into the base):
    the served model's log-probs are the trained policy's."""
    from conductor_engine.engine.providers import local
    from conductor_engine.engine.providers.pool import AgentSpec
    from conductor_engine.trainer.policy import load_policy, save_checkpoint

    monkeypatch.setenv("CONDUCTOR_DATA_DIR", str(smollm2_model_dir.parents[1]))
    policy = load_policy(PolicyConfig(base=local.SMOLLM2, lora_r=4, device="cpu"))
    assert policy.kind == "lora" and policy.tokenizer.chat_template
    tok = policy.tokenizer
    prompt = tok(tok.apply_chat_template([{"role": "user", "content": "Plan: 2 + 2?"}],
                                         add_generation_prompt=True, tokenize=False),
                 add_special_tokens=False)["input_ids"]
    samples = [Sample(prompt_ids=prompt, completion_ids=tok(text)["input_ids"], advantage=a)
               for text, a in (('{"steps": []}', 1.0), ("I cannot plan.", -1.0))]
    cfg = LossConfig(learning_rate=1e-3)
    step = train_step(policy.model, make_optimizer(policy.model, cfg), samples, cfg,
                      pad_id=policy.pad_id)
    assert step.skipped is None and step.tokens == sum(len(s.completion_ids) for s in samples)

    batch = collate(samples, policy.pad_id)
    with torch.no_grad():
        trained = per_token_logprobs(policy.model, batch)
        with policy.model.disable_adapter():
            base = per_token_logprobs(policy.model, batch)
    assert not torch.allclose(trained, base, atol=1e-3)  # the step moved the policy
    save_checkpoint(policy, tmp_path / "v1")
    served = local.load_model(AgentSpec(id="conductor", provider="local", model=local.SMOLLM2,
                                        checkpoint=str(tmp_path / "v1")))
    with torch.no_grad():
        torch.testing.assert_close(per_token_logprobs(served.model, batch), trained,
                                   rtol=1e-4, atol=1e-4)
