"""Losses against docs/algorithm.md sections 1-3, and against naive per-token references."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from grpo_core.algo.config import GRPOConfig, KLEstimator, LossAgg
from grpo_core.algo.losses import (
    agg_loss,
    clip_ratio,
    clipped_surrogate,
    grpo_loss,
    kl_penalty,
)
from grpo_core.model import logits as logits_module
from grpo_core.model.logits import entropy_from_logits, token_logprobs

MODES: list[LossAgg] = ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]


def log(p: float) -> torch.Tensor:
    return torch.tensor(math.log(p))


def test_clip_vectors_spec_1() -> None:
    ratios = torch.tensor([0.5, 0.9, 1.0, 1.1, 1.5])
    assert torch.allclose(clip_ratio(ratios, 0.2, 0.2), torch.tensor([0.8, 0.9, 1.0, 1.1, 1.2]))


@pytest.mark.parametrize(
    ("ratio", "advantage", "zero_grad"),
    [(1.5, 1.0, True), (1.5, -1.0, False), (0.5, -1.0, True), (0.5, 1.0, False), (1.1, 1.0, False)],
)
def test_clip_gradient_spec_1(ratio: float, advantage: float, zero_grad: bool) -> None:
    logp = torch.tensor(math.log(ratio), requires_grad=True)
    surrogate, low, high = clipped_surrogate(logp, torch.tensor(0.0), torch.tensor(advantage))
    surrogate.backward()
    assert logp.grad is not None
    assert (float(logp.grad) == 0.0) == zero_grad
    assert bool(low | high) == zero_grad


@given(
    st.floats(-3, 3, allow_nan=False),
    st.floats(-5, 5, allow_nan=False),
    st.floats(0.05, 0.5),
    st.floats(0.05, 0.5),
)
def test_clipped_tokens_have_zero_surrogate_gradient(
    log_ratio: float, advantage: float, eps_low: float, eps_high: float
) -> None:
    logp = torch.tensor(log_ratio, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor(advantage, dtype=torch.float64)
    surrogate, low, high = clipped_surrogate(
        logp, torch.zeros((), dtype=torch.float64), adv, eps_low, eps_high
    )
    surrogate.backward()
    assert logp.grad is not None
    if bool(low | high):
        assert float(logp.grad) == 0.0
    else:  # unclipped: d(ratio * A)/dlogp = ratio * A
        assert float(logp.grad) == pytest.approx(math.exp(log_ratio) * advantage, rel=1e-9)


@pytest.mark.parametrize(
    ("p_theta", "p_ref", "kl"),
    [(0.5, 0.5, 0.0), (0.3, 0.6, 0.307), (0.6, 0.3, 0.193), (0.1, 0.9, 5.803)],
)
def test_k3_vectors_spec_2(p_theta: float, p_ref: float, kl: float) -> None:
    assert float(kl_penalty(log(p_theta), log(p_ref), "k3")) == pytest.approx(kl, abs=1e-3)


def test_k1_k2_definitions() -> None:
    assert float(kl_penalty(log(0.3), log(0.6), "k1")) == pytest.approx(math.log(0.5), abs=1e-6)
    assert float(kl_penalty(log(0.3), log(0.6), "k2")) == pytest.approx(
        0.5 * math.log(2) ** 2, abs=1e-6
    )


@given(st.floats(-30, 0, allow_nan=False), st.floats(-30, 0, allow_nan=False))
def test_kl_non_negative_and_zero_at_equality(logp: float, ref: float) -> None:
    a, b = torch.tensor(logp, dtype=torch.float64), torch.tensor(ref, dtype=torch.float64)
    kinds: tuple[KLEstimator, ...] = ("k2", "k3")
    for kind in kinds:
        assert float(kl_penalty(a, b, kind)) >= 0.0
    for kind in ("k1", *kinds):
        assert float(kl_penalty(a, a, kind)) == 0.0


def naive_logprobs(logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, labels[..., None]).squeeze(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_equal_naive_values_and_grads(
    temperature: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logits_module, "LOGPROB_CHUNK_ROWS", 5)  # several chunks, a ragged last one
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 11, generator=gen, dtype=torch.float64) * 3
    labels = torch.randint(0, 11, (3, 7), generator=gen)
    weights = torch.randn(3, 7, generator=gen, dtype=torch.float64)
    ours_in = logits.clone().requires_grad_(True)
    ref_in = logits.clone().requires_grad_(True)
    ours = token_logprobs(ours_in, labels, temperature)
    ref = naive_logprobs(ref_in, labels, temperature)
    assert ours.dtype == torch.float32
    assert torch.allclose(ours.double(), ref.double(), atol=1e-5)
    (ours * weights).sum().backward()
    (ref.double() * weights).sum().backward()
    assert ours_in.grad is not None and ref_in.grad is not None
    assert torch.allclose(ours_in.grad, ref_in.grad, atol=1e-5)


def test_token_logprobs_bf16_logits_computed_in_float32() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(2, 4, 50, generator=gen) * 5).bfloat16().requires_grad_(True)
    labels = torch.randint(0, 50, (2, 4), generator=gen)
    ours = token_logprobs(logits, labels)
    assert ours.dtype == torch.float32
    assert torch.allclose(ours, naive_logprobs(logits.detach(), labels, 1.0), atol=1e-5)
    ours.sum().backward()
    assert logits.grad is not None and logits.grad.dtype == torch.bfloat16


def test_entropy_matches_naive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logits_module, "LOGPROB_CHUNK_ROWS", 3)
    logits = torch.randn(2, 5, 9, generator=torch.Generator().manual_seed(2))
    probs = torch.softmax(logits / 0.8, -1)
    naive = -(probs * probs.log()).sum(-1)
    assert torch.allclose(entropy_from_logits(logits, 0.8), naive, atol=1e-5)
    uniform = entropy_from_logits(torch.zeros(1, 1, 9))
    assert float(uniform) == pytest.approx(math.log(9), abs=1e-5)


def test_agg_modes_by_hand() -> None:
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # row 3 is empty
    assert float(agg_loss(loss, mask, "token-mean")) == pytest.approx(10 / 4)
    assert float(agg_loss(loss, mask, "seq-mean-token-mean")) == pytest.approx((2 + 4) / 2)
    assert float(agg_loss(loss, mask, "seq-mean-token-sum-norm", 5)) == pytest.approx(
        (6 / 5 + 4 / 5) / 2
    )
    with pytest.raises(ValueError, match="max_len"):
        agg_loss(loss, mask, "seq-mean-token-sum-norm")


@pytest.mark.parametrize("mode", MODES)
def test_all_empty_batch_gives_zero_with_grad(mode: LossAgg) -> None:
    loss = torch.randn(2, 3, requires_grad=True)
    out = agg_loss(loss, torch.zeros(2, 3), mode, 4)
    assert float(out.detach()) == 0.0
    out.backward()
    assert loss.grad is not None and torch.all(loss.grad == 0)


def naive_grpo_objective(
    logp: torch.Tensor,
    old: torch.Tensor,
    ref: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    cfg: GRPOConfig,
) -> torch.Tensor:
    """Per-token Python loops over spec sections 1-3, written independently of losses.py."""
    seq_terms, total, tokens = [], torch.zeros((), dtype=logp.dtype), 0
    for i in range(logp.shape[0]):
        row, count = torch.zeros((), dtype=logp.dtype), 0
        for t in range(logp.shape[1]):
            if mask[i, t] == 0:
                continue
            ratio = torch.exp(logp[i, t] - old[i, t])
            clipped = torch.clamp(ratio, 1 - cfg.eps_low, 1 + cfg.eps_high)
            surrogate = torch.min(ratio * adv[i, t], clipped * adv[i, t])
            x = torch.exp(ref[i, t] - logp[i, t])
            term = -(surrogate - cfg.beta * (x - torch.log(x) - 1))
            row, count = row + term, count + 1
        if count:
            seq_terms.append((row, count))
            total, tokens = total + row, tokens + count
    if not seq_terms:
        return total
    if cfg.loss_agg == "token-mean":
        return total / tokens
    if cfg.loss_agg == "seq-mean-token-mean":
        return sum(r / c for r, c in seq_terms) / len(seq_terms)  # type: ignore[return-value]
    return sum(r / cfg.max_len_norm for r, _ in seq_terms) / len(seq_terms)  # type: ignore[return-value]


@given(st.integers(0, 10_000), st.sampled_from(MODES), st.floats(0.0, 0.5))
def test_grpo_loss_gradient_equals_naive_loop(seed: int, mode: LossAgg, beta: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    shape = (4, 6)
    logp = (-torch.rand(shape, generator=gen, dtype=torch.float64) * 3).requires_grad_(True)
    old = logp.detach() + torch.randn(shape, generator=gen, dtype=torch.float64) * 0.3
    ref = logp.detach() + torch.randn(shape, generator=gen, dtype=torch.float64) * 0.5
    adv = torch.randn(shape, generator=gen, dtype=torch.float64)
    mask = (torch.rand(shape, generator=gen) > 0.4).double()
    mask[0] = 0.0  # an empty response
    cfg = GRPOConfig(beta=beta, loss_agg=mode, max_len_norm=7, eps_high=0.28)
    loss, _ = grpo_loss(logp, old, ref, adv, mask, cfg)
    (grad,) = torch.autograd.grad(loss, logp)
    naive_in = logp.detach().clone().requires_grad_(True)
    naive = naive_grpo_objective(naive_in, old, ref, adv, mask, cfg)
    assert float(loss.detach()) == pytest.approx(float(naive.detach()), abs=1e-9)
    if naive.requires_grad:
        (naive_grad,) = torch.autograd.grad(naive, naive_in)
    else:
        naive_grad = torch.zeros_like(grad)
    assert torch.allclose(grad, naive_grad, atol=1e-9)


@given(st.integers(0, 10_000), st.sampled_from(MODES))
def test_masked_positions_change_nothing(seed: int, mode: LossAgg) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 6, 7, generator=gen)
    labels = torch.randint(0, 7, (3, 6), generator=gen)
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]]).float()
    old = torch.randn(3, 6, generator=gen) * 0.1 - 2
    adv = torch.randn(3, 6, generator=gen)
    cfg = GRPOConfig(loss_agg=mode, beta=0.1, max_len_norm=6)

    def loss_and_grad(inp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inp = inp.clone().requires_grad_(True)
        logp = token_logprobs(inp, labels)
        loss, _ = grpo_loss(logp, old, old - 0.2, adv, mask, cfg)
        (grad,) = torch.autograd.grad(loss, inp)
        return loss, grad

    noise = torch.randn(logits.shape, generator=gen) * 50 * (1 - mask)[..., None]
    loss_a, grad_a = loss_and_grad(logits)
    loss_b, grad_b = loss_and_grad(logits + noise)
    assert torch.allclose(loss_a, loss_b, atol=1e-6)
    assert torch.allclose(grad_a, grad_b, atol=1e-6)
    assert torch.all(grad_a[mask == 0] == 0)


def test_grpo_loss_metrics_and_ref_requirement() -> None:
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.1], [0.2, 0.3, 0.3]]))
    old = torch.log(torch.tensor([[0.5, 0.25, 0.1], [0.4, 0.3, 0.3]]))  # ratios 1, 2 | 0.5, 1
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    cfg = GRPOConfig(beta=0.0)
    _, metrics = grpo_loss(logp, old, None, adv, mask, cfg, entropy=torch.ones(2, 3))
    assert metrics["clip_frac_high"] == pytest.approx(1 / 5)
    assert metrics["clip_frac_low"] == pytest.approx(1 / 5)
    assert metrics["ratio_max"] == pytest.approx(2.0, abs=1e-5)
    assert metrics["ratio_min"] == pytest.approx(0.5, abs=1e-5)
    assert metrics["response_length"] == pytest.approx(2.5)
    assert metrics["entropy"] == pytest.approx(1.0)
    assert "kl" not in metrics  # no KL term (beta 0): no KL figure, not a 0
    with pytest.raises(ValueError, match="reference"):
        grpo_loss(logp, old, None, adv, mask, GRPOConfig(beta=0.04))


def test_zero_advantage_sequences_are_counted() -> None:
    mask = torch.ones(3, 2)
    adv = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    logp = torch.zeros(3, 2)
    _, metrics = grpo_loss(logp, logp, None, adv, mask, GRPOConfig(beta=0.0))
    assert metrics["zero_adv_seq_frac"] == pytest.approx(2 / 3)


def test_row_weights_by_hand() -> None:
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    twice = torch.tensor([1.0, 2.0])  # row 2 stands for two identical rows
    assert float(agg_loss(loss, mask, "token-mean", row_weights=twice)) == pytest.approx(14 / 5)
    assert float(agg_loss(loss, mask, "seq-mean-token-mean", row_weights=twice)) == (
        pytest.approx((2 + 4 + 4) / 3)
    )
    assert float(
        agg_loss(loss, mask, "seq-mean-token-sum-norm", 5, row_weights=twice)
    ) == pytest.approx((6 / 5 + 2 * 4 / 5) / 3)


@given(st.integers(0, 10_000), st.sampled_from(MODES), st.floats(0.0, 0.5))
def test_row_weights_equal_repeated_rows(seed: int, mode: LossAgg, beta: float) -> None:
    """Loss, gradient and every metric of rows counted w times equal those of the batch
    with each row repeated w times."""
    gen = torch.Generator().manual_seed(seed)
    shape = (4, 5)
    logp = -torch.rand(shape, generator=gen, dtype=torch.float64) * 3
    old = logp + torch.randn(shape, generator=gen, dtype=torch.float64) * 0.3
    ref = logp + torch.randn(shape, generator=gen, dtype=torch.float64) * 0.5
    adv = torch.randn(4, 1, generator=gen, dtype=torch.float64).expand(shape).clone()
    adv[1] = 0.0  # a zero-advantage row
    mask = (torch.rand(shape, generator=gen) > 0.4).double()
    mask[0] = 0.0  # an empty response
    entropy = torch.rand(shape, generator=gen, dtype=torch.float64)
    weights = torch.randint(1, 4, (4,), generator=gen)
    cfg = GRPOConfig(beta=beta, loss_agg=mode, max_len_norm=7, eps_high=0.28)

    def loss_grad(
        rows: torch.Tensor, row_weights: torch.Tensor | None
    ) -> tuple[float, torch.Tensor, dict[str, float]]:
        inp = logp.clone().requires_grad_(True)
        loss, metrics = grpo_loss(
            inp[rows], old[rows], ref[rows], adv[rows], mask[rows], cfg,
            entropy=entropy[rows], row_weights=row_weights,
        )  # fmt: skip
        (grad,) = torch.autograd.grad(loss, inp, allow_unused=True)
        return float(loss.detach()), torch.zeros_like(logp) if grad is None else grad, metrics

    merged = loss_grad(torch.arange(4), weights)
    repeated = loss_grad(torch.arange(4).repeat_interleave(weights), None)
    assert merged[0] == pytest.approx(repeated[0], abs=1e-9)
    assert torch.allclose(merged[1], repeated[1], atol=1e-9)
    assert merged[2] == pytest.approx(repeated[2], abs=1e-9)
