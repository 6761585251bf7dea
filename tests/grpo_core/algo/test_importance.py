"""GSPO / GSPO-token ratios and the rollout correction, against docs/algorithm.md sections
10-11: hand-computed vectors, Hypothesis properties, and the update's copies."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_core.algo.config import GRPOConfig, LossAgg
from grpo_core.algo.importance import (
    RolloutWeights,
    policy_ratio,
    rollout_weights,
    sequence_log_ratio,
)
from grpo_core.algo.importance_config import (
    CorrectionLevel,
    CorrectionMode,
    ImportanceSampling,
    RolloutCorrection,
)
from grpo_core.algo.losses import agg_loss, grpo_loss, kl_penalty
from grpo_core.algo.update import grpo_update
from grpo_core.contracts.policy_batch import build_policy_batch
from grpo_core.model.forward import sequence_logprobs, sequence_logprobs_and_entropy
from tests.grpo_core.algo.test_update import ragged_batch
from tests.models import tiny_llama
from tests.recording_engine import RecordingEngine, assert_same_gradients

MODES: list[LossAgg] = ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]
LEVELS: list[ImportanceSampling] = ["token", "sequence", "sequence_token"]
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])


def log(p: float) -> float:
    return math.log(p)


def test_the_defaults_are_todays_token_ratio_and_no_correction() -> None:
    cfg = GRPOConfig()
    assert cfg.importance_sampling == "token" and cfg.clip_range == (0.2, 0.2)
    assert cfg.rollout_correction.mode == "off" and not cfg.reads_sampling_logprobs
    gspo = GRPOConfig(importance_sampling="sequence")
    assert gspo.clip_range == (3e-4, 4e-4)  # the GSPO paper's, section 5.1


def test_sequence_log_ratio_by_hand_spec_10() -> None:
    log_ratio = torch.tensor([[0.2, -0.4, 0.8, 9.0], [0.1, 0.3, 7.0, 7.0], [5.0, 5.0, 5.0, 5.0]])
    # the mean over each row's response tokens; padding never counts; an empty row gives 0
    got = sequence_log_ratio(log_ratio, MASK)
    assert torch.allclose(got, torch.tensor([0.2, 0.2, 0.0]))


def test_sequence_ratio_value_and_gradients_by_hand_spec_10() -> None:
    old = torch.zeros(1, 4)
    mask = MASK[:1]
    advantages = torch.tensor([[1.0, 2.0, 3.0, 100.0]])  # the padding's 100 must not count
    values = [log(1.3), log(0.8), log(1.1), log(50.0)]
    s = (1.3 * 0.8 * 1.1) ** (1 / 3)  # geometric mean of the response tokens' ratios
    grads = {}
    for level in LEVELS:
        logp = torch.tensor([values], requires_grad=True)
        ratio = policy_ratio(logp, old, mask, level)
        (ratio * advantages * mask).sum().backward()
        assert logp.grad is not None
        grads[level] = logp.grad[0].tolist()
        if level != "token":
            assert ratio[0, :3].tolist() == pytest.approx([s] * 3)
    assert grads["token"] == pytest.approx([1.3, 1.6, 3.3, 0.0])
    # sequence: every token's ratio is s, whose gradient spreads s / |o| over the row's tokens
    assert grads["sequence"] == pytest.approx([s * 6 / 3] * 3 + [0.0])
    # GSPO-token: s's value, each token its own gradient s * A_t
    assert grads["sequence_token"] == pytest.approx([s * 1, s * 2, s * 3, 0.0])


def test_gspo_loss_clips_whole_rows_at_the_papers_range_by_hand() -> None:
    # row 0: s = e^0.001 > 1 + 4e-4 with A > 0: clipped to 1.0004, no gradient
    # row 1: s = e^-0.0001 inside [1 - 3e-4, 1 + 4e-4] with A < 0: s * A
    logp = torch.tensor([[0.001, 0.001], [-0.0002, 0.0]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(2, 2, dtype=torch.float64)
    advantages = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(2, 2)
    cfg = GRPOConfig(importance_sampling="sequence", beta=0.0)
    loss, metrics = grpo_loss(logp, old, None, advantages, mask, cfg)
    expected = -(1.0004 + math.exp(-0.0001) * -1.0) / 2
    assert float(loss.detach()) == pytest.approx(expected, abs=1e-12)
    assert metrics["clip_frac_high"] == 0.5 and metrics["clip_frac_low"] == 0.0
    assert metrics["ratio_max"] == pytest.approx(math.exp(0.001))
    loss.backward()
    assert logp.grad is not None
    assert logp.grad[0].tolist() == [0.0, 0.0]
    # d/dlogp of -(s * A) / 2 with s = exp(mean): -s * A / (2 * 2) per token
    assert logp.grad[1].tolist() == pytest.approx([math.exp(-0.0001) / 4] * 2)


def reference_loss_of_today(
    logp: torch.Tensor,
    old: torch.Tensor,
    ref: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: GRPOConfig,
) -> torch.Tensor:
    """The token-level loss as grpo_loss computed it before the ratio had levels."""
    ratio = torch.exp((logp - old).clamp(-20.0, 20.0))
    clipped = ratio.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    surrogate = torch.minimum(ratio * advantages, clipped * advantages)
    loss_mat = -surrogate + cfg.beta * kl_penalty(logp, ref, cfg.kl_estimator)
    return agg_loss(loss_mat, mask, cfg.loss_agg, cfg.max_len_norm)


def random_batch(seed: int, rows: int = 4, width: int = 6) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, width + 1, (rows,), generator=gen)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    return {
        "logp": -torch.rand(rows, width, generator=gen) * 3,
        "old": -torch.rand(rows, width, generator=gen) * 3,
        "ref": -torch.rand(rows, width, generator=gen) * 3,
        "advantages": torch.randn(rows, generator=gen)[:, None].expand(rows, width).clone(),
        "token_advantages": torch.randn(rows, width, generator=gen),
        "mask": mask,
    }


@settings(deadline=None, max_examples=30)
@given(st.integers(0, 10_000), st.sampled_from(MODES), st.sampled_from(["tis", "mis"]))
def test_token_mode_is_todays_loss_bit_for_bit_and_an_equal_sampler_corrects_nothing(
    seed: int, mode: LossAgg, correction: CorrectionMode
) -> None:
    b = random_batch(seed)
    cfg = GRPOConfig(loss_agg=mode, max_len_norm=5, beta=0.04)
    corrected = GRPOConfig(
        loss_agg=mode,
        max_len_norm=5,
        beta=0.04,
        rollout_correction=RolloutCorrection(mode=correction),
    )
    grads = []
    for settings_ in (cfg, corrected):
        logp = b["logp"].clone().requires_grad_()
        loss, _ = grpo_loss(
            logp,
            b["old"],
            b["ref"],
            b["token_advantages"],
            b["mask"],
            settings_,
            sampler_logp=b["old"].clone(),
        )
        today = reference_loss_of_today(
            logp, b["old"], b["ref"], b["token_advantages"], b["mask"], cfg
        )
        assert torch.equal(loss, today)
        loss.backward()
        assert logp.grad is not None
        grads.append(logp.grad)
    assert torch.equal(grads[0], grads[1])


@settings(deadline=None, max_examples=30)
@given(st.floats(-2.0, 2.0), st.integers(1, 6), st.floats(-3.0, 3.0))
def test_a_row_whose_tokens_share_one_ratio_has_that_sequence_ratio(
    log_r: float, length: int, base: float
) -> None:
    old = torch.full((1, 6), base, dtype=torch.float64)
    logp = old + log_r
    mask = (torch.arange(6) < length).to(torch.float64)[None, :]
    for level in ("sequence", "sequence_token"):
        ratio = policy_ratio(logp, old, mask, level)
        token = policy_ratio(logp, old, mask, "token")
        assert torch.allclose(ratio[0, :length], token[0, :length], rtol=1e-12)


@settings(deadline=None, max_examples=30)
@given(st.integers(0, 10_000), st.floats(0.01, 0.3))
def test_gspo_and_gspo_token_agree_when_a_row_has_one_advantage(seed: int, eps: float) -> None:
    """GSPO-token reduces to GSPO in value and gradient under sequence-level advantages
    (seq-mean-token-mean: each row weighs as one output)."""
    b = random_batch(seed)
    noise = torch.randn(b["old"].shape, generator=torch.Generator().manual_seed(seed))
    b["logp"] = b["old"] + 0.1 * noise
    results = []
    for level in ("sequence", "sequence_token"):
        cfg = GRPOConfig(
            importance_sampling=level, beta=0.0, sequence_eps_low=eps, sequence_eps_high=eps
        )
        logp = b["logp"].clone().requires_grad_()
        loss, _ = grpo_loss(logp, b["old"], None, b["advantages"], b["mask"], cfg)
        loss.backward()
        assert logp.grad is not None
        results.append((loss.detach(), logp.grad * b["mask"]))
    assert torch.allclose(results[0][0], results[1][0], atol=1e-7)
    assert torch.allclose(results[0][1], results[1][1], atol=1e-7)


def weights(mode: CorrectionMode, level: CorrectionLevel, cap: float = 2.0) -> RolloutWeights:
    # raw token ratios pi_old / pi_sampler: row 0 = 3, 0.5, 1.5 (and padding);
    # row 1 = 1.5, 1.5 (product 2.25); row 2 empty
    old = torch.tensor(
        [[log(3.0), log(0.5), log(1.5), 0.0], [log(1.5), log(1.5), 0.0, 0.0], [0.0] * 4]
    )
    sampler = torch.tensor([[0.0, 0.0, 0.0, -30.0], [0.0, 0.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0]])
    settings_ = RolloutCorrection(mode=mode, level=level, cap=cap)
    return rollout_weights(old, sampler, MASK, settings_)


@pytest.mark.parametrize(
    ("mode", "level", "row0", "row1", "corrected0", "corrected1"),
    [
        ("tis", "token", [2.0, 0.5, 1.5], [1.5, 1.5], [True, False, False], [False, False]),
        ("mis", "token", [0.0, 0.5, 1.5], [1.5, 1.5], [True, False, False], [False, False]),
        # the sequence weight is the product of the row's token ratios: 2.25 and 2.25
        ("tis", "sequence", [2.0] * 3, [2.0] * 2, [True] * 3, [True] * 2),
        ("mis", "sequence", [0.0] * 3, [0.0] * 2, [True] * 3, [True] * 2),
        ("off", "token", [1.0] * 3, [1.0] * 2, [False] * 3, [False] * 2),
    ],
)
def test_rollout_weights_by_hand_spec_11(
    mode: CorrectionMode,
    level: CorrectionLevel,
    row0: list[float],
    row1: list[float],
    corrected0: list[bool],
    corrected1: list[bool],
) -> None:
    got = weights(mode, level)
    assert got.weights[0, :3].tolist() == pytest.approx(row0)
    assert got.weights[1, :2].tolist() == pytest.approx(row1)
    assert got.corrected[0, :3].tolist() == corrected0
    assert got.corrected[1, :2].tolist() == corrected1
    assert got.weights[2].tolist() == [1.0] * 4  # an empty row: weight 1, nothing to weigh


def test_mis_masks_below_one_over_cap_too() -> None:
    got = weights("mis", "token", cap=1.6)
    # 3 > 1.6 and 0.5 < 1 / 1.6 are masked; 1.5 stays with its weight
    assert got.weights[0, :3].tolist() == pytest.approx([0.0, 0.0, 1.5])


log_probs = st.lists(st.floats(-6.0, 0.0), min_size=1, max_size=6)


@settings(deadline=None, max_examples=50)
@given(
    log_probs,
    log_probs,
    st.floats(1.01, 10.0),
    st.sampled_from(["token", "sequence"]),
)
def test_weights_stay_in_their_bounds(
    old: list[float], sampler: list[float], cap: float, level: CorrectionLevel
) -> None:
    n = min(len(old), len(sampler))
    old_t, sampler_t = torch.tensor([old[:n]]), torch.tensor([sampler[:n]])
    mask = torch.ones(1, n)
    tis = rollout_weights(
        old_t, sampler_t, mask, RolloutCorrection(mode="tis", level=level, cap=cap)
    )
    assert bool((tis.weights <= cap).all() and (tis.weights > 0).all())
    assert torch.equal(tis.corrected, tis.raw > cap)
    mis = rollout_weights(
        old_t, sampler_t, mask, RolloutCorrection(mode="mis", level=level, cap=cap)
    )
    kept = mis.weights[~mis.corrected]
    assert bool((mis.weights[mis.corrected] == 0).all())
    assert bool(((kept >= 1 / cap * (1 - 1e-6)) & (kept <= cap * (1 + 1e-6))).all())
    same = rollout_weights(old_t, old_t, mask, RolloutCorrection(mode="mis", level=level, cap=cap))
    assert torch.equal(same.weights, torch.ones_like(same.weights))  # identity when they agree


def test_the_weight_multiplies_the_policy_term_not_the_kl_by_hand() -> None:
    logp = torch.tensor([[log(0.5), log(0.5)]])
    old = logp.clone()  # ratio 1: the surrogate is A on each token
    ref = torch.tensor([[log(0.25), log(0.5)]])
    sampler = torch.tensor([[log(0.5) - log(3.0), log(0.5) - log(1.5)]])  # weights 3 -> 2, 1.5
    advantages = torch.tensor([[1.0, 1.0]])
    cfg = GRPOConfig(beta=0.1, rollout_correction=RolloutCorrection(mode="tis", cap=2.0))
    loss, metrics = grpo_loss(
        logp, old, ref, advantages, torch.ones(1, 2), cfg, sampler_logp=sampler
    )
    k3 = 0.5 - math.log(0.5) - 1.0  # x = pi_ref / pi_theta = 0.5 on token 0, 0 on token 1
    assert float(loss.detach()) == pytest.approx((-2.0 - 1.5 + 0.1 * k3) / 2)
    assert metrics["policy_loss"] == pytest.approx((-2.0 - 1.5) / 2)
    assert metrics["rollout_weight_mean"] == pytest.approx(1.75)
    assert metrics["rollout_weight_truncated_frac"] == pytest.approx(0.5)
    assert metrics["rollout_weight_raw_max"] == pytest.approx(3.0)
    assert metrics["rollout_weight_raw_min"] == pytest.approx(1.5)
    assert "rollout_weight_masked_frac" not in metrics


def test_the_correction_without_sampler_logprobs_is_an_error() -> None:
    b = random_batch(0)
    cfg = GRPOConfig(beta=0.0, rollout_correction=RolloutCorrection(mode="tis"))
    with pytest.raises(ValueError, match="sampler's log-probs"):
        grpo_loss(b["logp"], b["old"], b["ref"], b["advantages"], b["mask"], cfg)
    batch = build_policy_batch([[1, 2]], [[3, 4]], 0)
    with pytest.raises(ValueError, match="sampler's log-probs"):
        grpo_update(RecordingEngine(tiny_llama()), None, batch, batch.response_mask, cfg)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_copies_sampled_apart_keep_their_own_weights_in_the_update(level: CorrectionLevel) -> None:
    """Identical rows run once only when their sampler log-probs agree too: a copy sampled
    with other log-probs keeps its own weight, so the update's gradient is the batch's."""
    prompts, completions = [[1, 2], [1, 2], [1, 2], [3]], [[4, 5, 6], [4, 5, 6], [4, 5, 6], [7, 8]]
    batch = build_policy_batch(prompts, completions, 0, "left")
    advantages = batch.expand_per_sequence(torch.tensor([1.0, 1.0, 1.0, -0.5]))
    policy = tiny_llama()
    logp, _ = sequence_logprobs_and_entropy(policy, batch)
    sampler = logp.detach() - 0.1 * batch.response_mask
    sampler[1] = logp.detach()[1] - 0.9 * batch.response_mask[1]  # truncated at cap 2
    cfg = GRPOConfig(
        beta=0.0, rollout_correction=RolloutCorrection(mode="tis", level=level, cap=2.0)
    )
    loss, expected = grpo_loss(
        logp, logp.detach(), None, advantages, batch.response_mask, cfg, sampler_logp=sampler
    )
    loss.backward()
    engine = RecordingEngine(tiny_llama())
    metrics = grpo_update(engine, None, batch, advantages, cfg, sampler)
    for param, merged in zip(policy.parameters(), engine.grads[0], strict=True):
        assert param.grad is not None and torch.allclose(param.grad, merged, atol=1e-6)
    for key in ("rollout_weight_mean", "rollout_weight_truncated_frac", "policy_loss"):
        assert metrics[key] == pytest.approx(expected[key], abs=1e-6), key
    assert 0 < metrics["rollout_weight_truncated_frac"] < 1


@pytest.mark.parametrize("level", ["sequence", "sequence_token"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("off_policy", ["sampler_as_pi_old", "tis"])
def test_every_split_of_the_batch_gives_its_gradient_at_every_level(
    level: ImportanceSampling, mode: LossAgg, off_policy: str
) -> None:
    """A sequence ratio and a sequence weight read one row's tokens only, so micro-batches and
    token budgets leave the gradient as one pass gives it (per-token advantages, as PPO's)."""
    batch, advantages = ragged_batch()
    gen = torch.Generator().manual_seed(1)
    advantages = advantages + 0.3 * torch.randn(advantages.shape, generator=gen)
    with torch.no_grad():
        current = sequence_logprobs(tiny_llama(), batch)
    noise = 0.05 * torch.randn(current.shape, generator=gen) * batch.response_mask
    sampler = current + noise
    off = (
        {"use_sampling_logprobs_as_old": True}
        if off_policy == "sampler_as_pi_old"
        else {"rollout_correction": RolloutCorrection(mode="tis", level="token", cap=1.03)}
    )
    grads, metrics = [], []
    for split in (
        {"micro_batch_size": 8},
        {"micro_batch_size": 2},
        {"max_tokens_per_micro_batch": 14},
    ):
        cfg = GRPOConfig(
            loss_agg=mode, importance_sampling=level, max_len_norm=7, beta=0.0, **split, **off
        )
        engine = RecordingEngine(tiny_llama())
        metrics.append(grpo_update(engine, None, batch, advantages, cfg, sampler))
        grads.append(engine.grads)
    for other in grads[1:]:
        assert_same_gradients(other, grads[0], atol=1e-6)
    clipped_or_cut = ("clip_frac_low", "clip_frac_high", "rollout_weight_truncated_frac")
    assert any(metrics[0].get(key, 0.0) > 0 for key in clipped_or_cut)
    for other in metrics[1:]:
        for key in ("loss", "clip_frac_low", "clip_frac_high", "ratio_mean"):
            assert other[key] == pytest.approx(metrics[0][key], abs=1e-6), key
