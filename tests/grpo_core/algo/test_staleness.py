"""Asynchronous GRPO's staleness rules and its off-policy objectives against
docs/algorithm.md section 15: which version samples each step, the bound, and the decoupled
objective's weights on a hand-built stale batch."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.importance import rollout_weights
from grpo_core.algo.importance_config import RolloutCorrection
from grpo_core.algo.losses import grpo_loss
from grpo_core.algo.staleness import (
    DROPPED,
    POLICY_VERSION,
    STALENESS,
    may_sample,
    sampling_version,
    staleness,
    staleness_stats,
    within_bound,
)
from grpo_core.algo.staleness_config import AsyncSettings


def test_step_s_is_sampled_by_version_s_minus_k_from_policy_k_on() -> None:
    assert [sampling_version(s, 0) for s in range(4)] == [0, 1, 2, 3]  # synchronous
    assert [sampling_version(s, 1) for s in range(4)] == [0, 0, 1, 2]  # one step off
    assert [sampling_version(s, 2) for s in range(5)] == [0, 0, 0, 1, 2]
    # a stage resumed at step 3 has no version before 3 to give: its first batches are fresher
    assert [sampling_version(s, 2, first_version=3) for s in range(3, 7)] == [3, 3, 3, 4]


@given(st.integers(0, 10_000), st.integers(0, 64), st.integers(0, 10_000))
def test_the_wait_rule_never_leaves_the_bound(step: int, k: int, first: int) -> None:
    if first > step:
        return
    version = sampling_version(step, k, first)
    assert 0 <= staleness(step, version) <= k
    assert within_bound(step, version, k)


def test_the_bound_and_a_batch_from_the_future() -> None:
    assert within_bound(5, 4, 1) and not within_bound(5, 3, 1)
    with pytest.raises(ValueError, match="later policy version"):
        staleness(2, 3)


def test_when_the_sampler_may_start_a_step() -> None:
    wait, drop = AsyncSettings(max_staleness=1), AsyncSettings(max_staleness=1, on_stale="drop")
    # wait: step 3 needs version 2, handed on when the trainer starts step 2
    assert not may_sample(3, taken=2, newest=1, settings=wait)
    assert may_sample(3, taken=2, newest=2, settings=wait)
    # drop: any version, but at most max_staleness batches beyond the one taken next
    assert may_sample(3, taken=2, newest=0, settings=drop)
    assert not may_sample(4, taken=2, newest=2, settings=drop)
    # a stage resumed at step 2 samples nothing before its version 2 is handed on
    assert not may_sample(3, taken=2, newest=0, settings=drop, first_version=2)


def test_the_stored_figures_of_a_step() -> None:
    assert staleness_stats(5, 4, 1) == {POLICY_VERSION: 4.0, STALENESS: 1.0, DROPPED: 1.0}


def log(p: float) -> float:
    return math.log(p)


# A batch of step 1 sampled by version 0 (pi_behav), trained on version 1 (pi_prox: the
# trainer's recomputed pi_old); each token's probability under each.
BEHAVIOUR = torch.tensor([[log(0.25), log(0.5), log(0.1)]])
PROXIMAL = torch.tensor([[log(0.5), log(0.25), log(0.1)]])
MASK = torch.ones(1, 3)


@pytest.mark.parametrize(
    ("mode", "weights"),
    [("off", [1.0, 1.0, 1.0]), ("tis", [1.5, 0.5, 1.0]), ("mis", [0.0, 0.0, 1.0])],
)
def test_the_decoupled_weights_of_a_stale_batch_by_hand(mode: str, weights: list[float]) -> None:
    """pi_prox / pi_behav = 2, 0.5, 1: tis caps at 1.5; mis zeroes outside [1/1.5, 1.5]."""
    correction = RolloutCorrection.model_validate({"mode": mode, "cap": 1.5})
    got = rollout_weights(PROXIMAL, BEHAVIOUR, MASK, correction)
    assert got.raw[0].tolist() == pytest.approx([2.0, 0.5, 1.0])
    assert got.weights[0].tolist() == pytest.approx(weights)


def test_the_decoupled_loss_at_its_first_update_is_the_weighted_advantage_by_hand() -> None:
    """logp = pi_prox: ratio 1, so the loss is -mean(w * A) = -(1.5 + 0.5 + 1) / 3."""
    cfg = GRPOConfig(
        beta=0.0, loss_agg="token-mean", rollout_correction=RolloutCorrection(mode="tis", cap=1.5)
    )
    advantages = torch.ones(1, 3)
    loss, metrics = grpo_loss(
        PROXIMAL, PROXIMAL, None, advantages, MASK, cfg, sampler_logp=BEHAVIOUR
    )
    assert float(loss) == pytest.approx(-3.0 / 3)
    assert metrics["rollout_weight_mean"] == pytest.approx(1.0)
    assert metrics["rollout_weight_raw_max"] == pytest.approx(2.0)


def test_pi_old_the_sampling_policy_clips_around_the_stale_sampler_by_hand() -> None:
    """use_sampling_logprobs_as_old: the ratio is pi_theta / pi_behav = 2, 0.5, 1; clipped to
    [0.8, 1.2] for A = 1 the surrogate is min(r, clip(r)) = 1.2, 0.5, 1."""
    cfg = GRPOConfig(beta=0.0, loss_agg="token-mean", use_sampling_logprobs_as_old=True)
    loss, _ = grpo_loss(PROXIMAL, BEHAVIOUR, None, torch.ones(1, 3), MASK, cfg)
    assert float(loss) == pytest.approx(-(1.2 + 0.5 + 1.0) / 3)
