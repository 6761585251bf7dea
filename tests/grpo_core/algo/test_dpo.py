"""The DPO loss, its IPO and conservative forms, and the pairs built from a step's groups,
against docs/algorithm.md section 12: hand-computed vectors and Hypothesis properties."""

import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from grpo_core.algo.advantages import AdvantageInputs
from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.dpo import (
    dpo_estimator,
    dpo_ranked_estimator,
    pair_rows,
    preference_loss,
    ranked_pairs,
    row_sides,
    sequence_logprob,
    verifier_pairs,
)
from grpo_core.algo.dpo_config import DPOConfig

T = torch.tensor


def loss_of(margin: float, **settings: Any) -> tuple[float, float, float]:
    """The loss and the two implicit rewards of one pair whose log-ratios are (margin, 0)."""
    terms = preference_loss(T([margin]), T([0.0]), T([0.0]), T([0.0]), DPOConfig(**settings))
    return float(terms.losses[0]), float(terms.chosen_rewards[0]), float(terms.rejected_rewards[0])


def test_dpo_ipo_and_conservative_losses_by_hand_spec_12() -> None:
    # chosen: log pi -10, log pi_ref -12 (log-ratio +2); rejected: -8, -7 (-1); margin 3
    pc, pr, rc, rr = T([-10.0]), T([-8.0]), T([-12.0]), T([-7.0])
    dpo = preference_loss(pc, pr, rc, rr, DPOConfig(beta=0.1))
    assert float(dpo.losses[0]) == pytest.approx(math.log(1 + math.exp(-0.3)))  # 0.554355
    assert float(dpo.losses[0]) == pytest.approx(0.554355, abs=1e-6)
    assert (float(dpo.chosen_rewards[0]), float(dpo.rejected_rewards[0])) == pytest.approx(
        (0.2, -0.1)
    )
    assert float(dpo.margins[0]) == pytest.approx(0.3)
    cdpo = preference_loss(pc, pr, rc, rr, DPOConfig(beta=0.1, label_smoothing=0.1))
    # 0.9 * 0.554355 + 0.1 * (0.3 + 0.554355)
    assert float(cdpo.losses[0]) == pytest.approx(0.584355, abs=1e-6)
    ipo = preference_loss(pc, pr, rc, rr, DPOConfig(beta=0.25, loss="ipo"))
    assert float(ipo.losses[0]) == pytest.approx((3.0 - 2.0) ** 2)  # target 1 / (2 * 0.25)


def test_the_dpo_gradient_is_the_papers_coefficient_by_hand() -> None:
    """d loss / d log pi(chosen) = -beta * sigmoid(-beta m), the rejected's the opposite:
    the gradient coefficient of DeepSeekMath's unified paradigm."""
    pc, pr = T([-10.0], requires_grad=True), T([-8.0], requires_grad=True)
    preference_loss(pc, pr, T([-12.0]), T([-7.0]), DPOConfig(beta=0.1)).losses.sum().backward()
    coefficient = 0.1 / (1 + math.exp(0.3))  # 0.0425557
    assert pc.grad is not None and pr.grad is not None
    assert float(pc.grad[0]) == pytest.approx(-coefficient)
    assert float(pr.grad[0]) == pytest.approx(coefficient)


def test_sequence_logprob_sums_or_averages_response_tokens_by_hand() -> None:
    logp = T([[-1.0, -2.0, -3.0], [-0.5, -9.0, -9.0], [-7.0, -7.0, -7.0]])
    mask = T([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert sequence_logprob(logp, mask).tolist() == [-6.0, -0.5, 0.0]
    assert sequence_logprob(logp, mask, "mean").tolist() == [-2.0, -0.5, 0.0]


def test_verifier_pairs_by_hand() -> None:
    correct = T([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    every = torch.ones(3, 4, dtype=torch.bool)
    assert verifier_pairs(correct, every).tolist() == [
        [1, -1, 1, -1],  # two right, two wrong: two pairs
        [1, 0, 0, -1],  # three right, one wrong: the first right one pairs
        [0, 0, 0, 0],  # no right output: no pair
    ]
    empty_second = every.clone()
    empty_second[0, 1] = False  # an output without response tokens pairs with nothing
    assert verifier_pairs(correct[:1], empty_second[:1]).tolist() == [[1, 0, 0, -1]]


def test_ranked_pairs_by_hand() -> None:
    every = torch.ones(1, 4, dtype=torch.bool)
    # best with worst, second with third
    assert ranked_pairs(T([[0.2, 0.8, 0.6, 0.4]]), every).tolist() == [[-1, 1, 1, -1]]
    # the second best ties the second worst: one pair only
    assert ranked_pairs(T([[0.9, 0.1, 0.5, 0.5]]), every).tolist() == [[1, -1, 0, 0]]
    assert ranked_pairs(T([[0.5, 0.5, 0.5, 0.5]]), every).tolist() == [[0, 0, 0, 0]]
    # an odd group: the median output is in no pair
    assert ranked_pairs(T([[0.3, 0.7, 0.5]]), every[:, :3]).tolist() == [[-1, 1, 0]]
    # the ineligible top score is left out: 0.6 against 0.4
    eligible = T([[True, False, True, True]])
    assert ranked_pairs(T([[0.2, 0.8, 0.6, 0.4]]), eligible).tolist() == [[-1, 0, 1, 0]]


def test_pairs_of_a_batch_by_hand() -> None:
    sides = T([1.0, -1.0, 1.0, -1.0, 1.0, 0.0, 0.0, -1.0])
    chosen, rejected = pair_rows(sides)
    assert (chosen.tolist(), rejected.tolist()) == ([0, 2, 4], [1, 3, 7])
    with pytest.raises(ValueError, match="as many chosen as rejected"):
        pair_rows(T([1.0, 1.0, -1.0]))
    advantages = T([[0.0, 1.0, 1.0], [-1.0, -1.0, 0.0], [0.0, 0.0, 0.0]])
    mask = T([[0.0, 1.0, 1.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert row_sides(advantages, mask).tolist() == [1.0, -1.0, 0.0]


def test_the_estimators_mark_each_pair_on_its_response_tokens() -> None:
    mask = T([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    inputs = AdvantageInputs(
        response_mask=mask, rewards=T([[0.1, 0.9], [0.7, 0.2]]), correct=T([[0.0, 1.0], [1.0, 1.0]])
    )
    assert dpo_estimator(inputs, 1e-4).tolist() == [[-1, -1], [1, 0], [0, 0], [0, 0]]
    # the second group's second output is empty: nothing to pair the first with
    assert dpo_ranked_estimator(inputs, 1e-4).tolist() == [[-1, -1], [1, 0], [0, 0], [0, 0]]


def test_the_dpo_settings_refuse_what_its_loss_would_ignore() -> None:
    assert GRPOConfig(adv_estimator="dpo", beta=0.0).loss_reads_reference
    assert not GRPOConfig(beta=0.0).loss_reads_reference
    with pytest.raises(ValidationError, match=r"grpo.algo.beta: 0 \(DPO's loss holds pi_ref"):
        GRPOConfig(adv_estimator="dpo")  # the KL term's default beta
    with pytest.raises(ValidationError, match=r"set grpo\.algo\.rollout_correction\.mode: off"):
        GRPOConfig(adv_estimator="dpo", beta=0.0, rollout_correction={"mode": "tis"})
    with pytest.raises(ValidationError, match="importance_sampling: token"):
        GRPOConfig(adv_estimator="dpo_ranked", beta=0.0, importance_sampling="sequence")
    with pytest.raises(ValidationError, match="mask_truncated: false"):
        GRPOConfig(adv_estimator="dpo", beta=0.0, mask_truncated=True)
    with pytest.raises(ValidationError, match="max_tokens_per_micro_batch: null"):
        GRPOConfig(adv_estimator="dpo", beta=0.0, max_tokens_per_micro_batch=512)
    with pytest.raises(ValidationError, match=r"label_smoothing = 0\.1 smooths the sigmoid"):
        DPOConfig(loss="ipo", label_smoothing=0.1)


@settings(deadline=None, max_examples=50)
@given(st.floats(-50.0, 50.0), st.floats(0.01, 5.0), st.sampled_from([0.0, 0.1, 0.3]))
def test_swapping_chosen_and_rejected_negates_the_margin(
    margin: float, beta: float, smoothing: float
) -> None:
    """L(-m) - L(m) = (1 - 2e) beta m: the swap flips the preference, and the two sides'
    implicit rewards trade places."""
    loss, chosen, rejected = loss_of(margin, beta=beta, label_smoothing=smoothing)
    cfg = DPOConfig(beta=beta, label_smoothing=smoothing)
    swapped = preference_loss(T([0.0]), T([margin]), T([0.0]), T([0.0]), cfg)
    assert float(swapped.losses[0]) - loss == pytest.approx(
        (1 - 2 * smoothing) * beta * margin, abs=1e-4
    )
    assert (float(swapped.chosen_rewards[0]), float(swapped.rejected_rewards[0])) == (
        rejected,
        chosen,
    )


@settings(deadline=None, max_examples=50)
@given(st.floats(0.05, 5.0), st.floats(-20.0, 20.0))
def test_ipo_is_least_at_its_target_margin(beta: float, margin: float) -> None:
    target = 1 / (2 * beta)
    at_target = T([target], requires_grad=True)
    ipo = DPOConfig(beta=beta, loss="ipo")
    loss = preference_loss(at_target, T([0.0]), T([0.0]), T([0.0]), ipo).losses.sum()
    loss.backward()
    assert float(loss.detach()) == pytest.approx(0.0, abs=1e-9)
    assert at_target.grad is not None and float(at_target.grad[0]) == pytest.approx(0.0, abs=1e-5)
    assert loss_of(margin, beta=beta, loss="ipo")[0] >= float(loss.detach())


@settings(deadline=None, max_examples=50)
@given(st.floats(-30.0, 30.0), st.floats(-30.0, 30.0), st.floats(-30.0, 30.0))
def test_only_the_log_ratios_matter(chosen: float, rejected: float, shift: float) -> None:
    """Adding a constant to an output's policy and reference log-probs changes nothing."""
    cfg = DPOConfig(beta=0.5)
    plain = preference_loss(T([chosen]), T([rejected]), T([0.0]), T([0.0]), cfg)
    shifted = preference_loss(T([chosen + shift]), T([rejected]), T([shift]), T([0.0]), cfg)
    assert float(shifted.losses[0]) == pytest.approx(float(plain.losses[0]), abs=1e-4)


@settings(deadline=None, max_examples=60)
@given(st.integers(1, 4), st.integers(2, 6), st.integers(0, 10_000))
def test_pairs_are_balanced_strict_and_maximal(prompts: int, group: int, seed: int) -> None:
    """Per group: as many chosen as rejected; verifier pairs right over wrong, min(right,
    wrong) of them; ranked pairs score every chosen above every rejected, and one more pair
    would not (a tie, or no output left)."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 3, (prompts, group), generator=gen).float() / 2
    eligible = torch.rand(prompts, group, generator=gen) > 0.2
    correct = (scores > 0.5).float()
    for sides in (verifier_pairs(correct, eligible), ranked_pairs(scores, eligible)):
        assert torch.equal((sides > 0).sum(-1), (sides < 0).sum(-1))
        assert not bool(((sides != 0) & ~eligible).any())
        chosen, rejected = pair_rows(sides.flatten())
        assert torch.equal(chosen // group, rejected // group)  # never across groups
    sides = verifier_pairs(correct, eligible)
    right, wrong = (correct > 0) & eligible, (correct == 0) & eligible
    assert torch.equal((sides > 0).sum(-1), torch.minimum(right.sum(-1), wrong.sum(-1)))
    assert not bool(((sides > 0) & ~right).any() or ((sides < 0) & ~wrong).any())
    sides = ranked_pairs(scores, eligible)
    for p in range(prompts):
        picked = scores[p][sides[p] > 0]
        dropped = scores[p][sides[p] < 0]
        if len(picked):
            assert float(picked.min()) > float(dropped.max())
        left = scores[p][(sides[p] == 0) & eligible[p]]
        # one more pair would take the best and the worst output left: too few, or tied
        assert len(left) < 2 or float(left.max()) == float(left.min())
