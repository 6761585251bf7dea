"""PPO's formulas (grpo_core/algo/ppo.py) on hand-computed vectors, and their invariants."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_core.algo.advantages import AdvantageInputs, PPOTerms
from grpo_core.algo.estimators import ADVANTAGE_ESTIMATORS, get_adv_estimator
from grpo_core.algo.ppo import (
    adaptive_kl_coef,
    clipped_value_loss,
    explained_variance,
    gae_advantages,
    kl_shaped_rewards,
    masked_whiten,
    ppo_targets,
    sequence_kl,
)


def test_kl_shaped_reward_is_the_spec_vector_and_the_score_sits_on_the_last_token() -> None:
    # spec section 2: beta 0.04, pi_theta 0.8, pi_ref 0.2: -0.04 * log(0.8 / 0.2) = -0.0555
    log_ratio = torch.full((2, 3), math.log(0.8 / 0.2))
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    rewards = kl_shaped_rewards(torch.tensor([1.0, 0.5]), log_ratio, mask, kl_coef=0.04)
    # row 0: -0.0555 on each token, the score 1 added on token 2: 1 - 0.0555 = 0.9445
    # row 1: one token: 0.5 - 0.0555 = 0.4445; padding 0
    want = torch.tensor([[-0.0555, -0.0555, 0.9445], [0.4445, 0.0, 0.0]])
    assert torch.allclose(rewards, want, atol=1e-4)


def test_gae_on_a_three_token_trajectory_with_known_values() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    mask = torch.ones(1, 3)
    adv = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8)
    # t=2 (last, V(end) = 0): delta = 1 - 0.7 = 0.3;                    A2 = 0.3
    # t=1: delta = 0 + 0.9 * 0.7 - 0.6 = 0.03;  A1 = 0.03 + 0.72 * 0.3 = 0.246
    # t=0: delta = 0 + 0.9 * 0.6 - 0.5 = 0.04;  A0 = 0.04 + 0.72 * 0.246 = 0.21712
    assert torch.allclose(adv, torch.tensor([[0.21712, 0.246, 0.3]]), atol=1e-5)


def test_gae_stops_at_an_outputs_last_token_and_zeroes_padding() -> None:
    # the padded row's values past its end (9.0) must not leak into its advantages
    rewards = torch.tensor([[0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    adv = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8)
    # t=1: delta = 1 - 0.6 = 0.4; t=0: delta = 0.9 * 0.6 - 0.5 = 0.04, A0 = 0.04 + 0.72 * 0.4
    assert torch.allclose(adv, torch.tensor([[0.328, 0.4, 0.0]]), atol=1e-6)


def test_returns_are_advantages_plus_values_before_whitening() -> None:
    terms = PPOTerms(
        values=torch.tensor([[0.5, 0.6, 0.7]]),
        log_ratio=torch.zeros(1, 3),
        kl_coef=0.1,
        gamma=0.9,
        lam=0.8,
        whiten=True,
    )
    targets = ppo_targets(terms, torch.tensor([1.0]), torch.ones(1, 3))
    # returns = [0.21712 + 0.5, 0.246 + 0.6, 0.3 + 0.7]
    assert torch.allclose(targets.returns, torch.tensor([[0.71712, 0.846, 1.0]]), atol=1e-5)


def test_value_clipping_binds_and_does_not() -> None:
    mask = torch.ones(1, 1)
    # binds: V = 1.0 moved 0.5 from V_old = 0.5, clip 0.2 -> V_clip = 0.7; R = 1.2:
    # (V - R)^2 = 0.04, (V_clip - R)^2 = 0.25 -> 0.5 * max = 0.125, clipped fraction 1
    loss, clipped = clipped_value_loss(
        torch.tensor([[1.0]]), torch.tensor([[0.5]]), torch.tensor([[1.2]]), mask, clip=0.2
    )
    assert float(loss) == pytest.approx(0.125) and float(clipped) == 1.0
    # does not bind: V = 0.6 is within 0.2 of 0.5, V_clip = V: 0.5 * 0.6^2 = 0.18
    loss, clipped = clipped_value_loss(
        torch.tensor([[0.6]]), torch.tensor([[0.5]]), torch.tensor([[1.2]]), mask, clip=0.2
    )
    assert float(loss) == pytest.approx(0.18) and float(clipped) == 0.0


def test_clipped_value_loss_gradient_is_zero_where_the_clip_binds() -> None:
    # V = 1.0, V_old = 0.5, clip 0.2: the clipped term (constant in V) is the max
    values = torch.tensor([[1.0, 0.6]], requires_grad=True)
    loss, _ = clipped_value_loss(
        values, torch.tensor([[0.5, 0.5]]), torch.tensor([[1.2, 1.2]]), torch.ones(1, 2), 0.2
    )
    loss.backward()
    assert values.grad is not None
    # token 1: d/dV 0.5 * (V - R)^2 / 2 tokens = (0.6 - 1.2) / 2 = -0.3
    assert torch.allclose(values.grad, torch.tensor([[0.0, -0.3]]))


def test_kl_controller_update() -> None:
    # KL 9 vs target 6: error 0.5 clipped to 0.2; 1 + 0.2 * 256 / 10000 = 1.00512
    assert adaptive_kl_coef(0.1, 9.0, 6.0, 10000, 256) == pytest.approx(0.100512)
    # KL 3: error -0.5 clipped to -0.2 -> 0.99488
    assert adaptive_kl_coef(0.1, 3.0, 6.0, 10000, 256) == pytest.approx(0.099488)
    # KL 6.6: error 0.1 within the clip -> 1 + 0.1 * 0.0256 = 1.00256
    assert adaptive_kl_coef(0.1, 6.6, 6.0, 10000, 256) == pytest.approx(0.100256)


def test_masked_whiten_and_explained_variance() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    # mean 2, population var 2/3, std 0.8165: [-1.2247, 0, 1.2247], padding 0
    assert torch.allclose(
        masked_whiten(x, mask), torch.tensor([[-1.2247, 0.0, 1.2247, 0.0]]), atol=1e-4
    )
    # R = [1, 2, 3] (var 2/3), V = [1, 2, 2]: R - V = [0, 0, 1], var 2/9 -> 1 - 1/3 = 2/3
    ev = explained_variance(torch.tensor([[1.0, 2.0, 2.0, 5.0]]), x, mask)
    assert ev == pytest.approx(2 / 3)
    assert sequence_kl(torch.tensor([[0.1, 0.2, 7.0]]), torch.tensor([[1.0, 1.0, 0.0]])) == (
        pytest.approx(0.3)
    )


def test_ppo_is_a_registered_estimator_reading_the_critic() -> None:
    spec = ADVANTAGE_ESTIMATORS["ppo"]
    assert spec.needs_values and spec.needs_weighted_reward and spec.data_sources == {"online"}
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    terms = PPOTerms(torch.zeros(2, 3), torch.zeros(2, 3), 0.0, 1.0, 1.0, whiten=False)
    inputs = AdvantageInputs(mask, rewards=torch.tensor([[1.0, 0.0]]), ppo=terms)
    # gamma = lam = 1, zero values, no KL: every token's advantage is the output's reward
    adv = get_adv_estimator("ppo")(inputs, 1e-4)
    assert adv.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match=r"AdvantageInputs\.ppo"):
        get_adv_estimator("ppo")(AdvantageInputs(mask, rewards=torch.ones(1, 2)), 1e-4)


lengths = st.lists(st.integers(0, 6), min_size=1, max_size=4)
reward = st.floats(-5, 5, allow_nan=False, width=32)


@settings(max_examples=60, deadline=None)
@given(lengths, st.data())
def test_gae_with_unit_gamma_lambda_and_zero_values_is_the_reward_to_go(
    row_lengths: list[int], data: st.DataObject
) -> None:
    width = max(row_lengths)
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in row_lengths])
    rewards = (
        torch.tensor(
            [data.draw(st.lists(reward, min_size=width, max_size=width)) for _ in row_lengths]
        ).reshape(len(row_lengths), width)
        * mask
    )
    adv = gae_advantages(rewards, torch.zeros_like(rewards), mask, gamma=1.0, lam=1.0)
    to_go = rewards.flip(-1).cumsum(-1).flip(-1) * mask
    assert torch.allclose(adv, to_go, atol=1e-4)
    assert bool((adv[mask == 0] == 0).all())


@settings(max_examples=60, deadline=None)
@given(lengths, st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.data())
def test_gae_masked_positions_get_zero_and_returns_match_td_lambda_one(
    row_lengths: list[int], gamma: float, lam: float, data: st.DataObject
) -> None:
    width = max(row_lengths)
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in row_lengths])
    shape = (len(row_lengths), width)
    draw = st.lists(reward, min_size=width * shape[0], max_size=width * shape[0])
    rewards = torch.tensor(data.draw(draw)).reshape(shape)
    values = torch.tensor(data.draw(draw)).reshape(shape)
    adv = gae_advantages(rewards, values, mask, gamma, lam)
    assert bool((adv[mask == 0] == 0).all())
    if lam == 1.0:  # lambda = 1: A_t + V_t is the discounted reward-to-go (Monte Carlo)
        for r, n in enumerate(row_lengths):
            for t in range(n):
                to_go = sum(gamma ** (j - t) * float(rewards[r, j]) for j in range(t, n))
                assert float(adv[r, t] + values[r, t]) == pytest.approx(to_go, abs=1e-3)


@settings(max_examples=60, deadline=None)
@given(st.floats(1e-3, 10.0), st.floats(0.0, 100.0), st.floats(1e-3, 10.0), st.integers(1, 512))
def test_kl_controller_moves_towards_the_target_by_at_most_its_clip(
    coef: float, kl: float, target: float, n_steps: int
) -> None:
    horizon = 10000
    new = adaptive_kl_coef(coef, kl, target, horizon, n_steps)
    bound = coef * 0.2 * n_steps / horizon  # Ziegler et al.: the error is clipped to +-0.2
    assert abs(new - coef) <= bound + 1e-12
    if kl > target:
        assert new >= coef
    elif kl < target:
        assert new <= coef


@settings(max_examples=60, deadline=None)
@given(lengths, st.floats(0.0, 1.0), st.data())
def test_shaped_rewards_of_an_output_sum_to_its_score_minus_the_penalty(
    row_lengths: list[int], kl_coef: float, data: st.DataObject
) -> None:
    width = max(row_lengths)
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in row_lengths])
    shape = (len(row_lengths), width)
    draw = st.lists(reward, min_size=width * shape[0], max_size=width * shape[0])
    log_ratio = torch.tensor(data.draw(draw)).reshape(shape)
    scores = torch.tensor(data.draw(st.lists(reward, min_size=shape[0], max_size=shape[0])))
    shaped = kl_shaped_rewards(scores, log_ratio, mask, kl_coef)
    has_tokens = mask.sum(-1) > 0
    want = (scores * has_tokens) - kl_coef * (log_ratio * mask).sum(-1)
    assert torch.allclose(shaped.sum(-1), want, atol=1e-3)
    assert bool((shaped[mask == 0] == 0).all())


@settings(max_examples=60, deadline=None)
@given(lengths.filter(lambda n: sum(n) >= 2), st.data())
def test_whitened_advantages_have_zero_mean_and_unit_variance_on_the_mask(
    row_lengths: list[int], data: st.DataObject
) -> None:
    width = max(row_lengths)
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in row_lengths])
    values = st.lists(st.floats(-5, 5, width=32), min_size=mask.numel(), max_size=mask.numel())
    x = torch.tensor(data.draw(values), dtype=torch.float64).reshape(mask.shape)
    picked = x[mask > 0]
    if float(picked.var(unbiased=False)) < 1e-3:  # near-constant: whitening only centres
        return
    out = masked_whiten(x, mask.double())[mask > 0]
    assert float(out.mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(out.var(unbiased=False)) == pytest.approx(1.0, abs=1e-4)
