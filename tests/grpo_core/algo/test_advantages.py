"""Advantage estimators against docs/algorithm.md sections 4-6."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from grpo_core.algo.advantages import (
    AdvantageInputs,
    outcome_advantages,
    process_advantages,
    rft_coefficients,
    sft_coefficients,
    step_rewards_to_token_advantages,
    zero_advantage_group_fraction,
)
from grpo_core.algo.estimators import ADVANTAGE_ESTIMATORS, get_adv_estimator


def test_outcome_vector_spec_4() -> None:
    rewards = torch.tensor([[0.2, 0.8, 0.5, 0.3, 0.7]])
    adv = outcome_advantages(rewards)[0]
    std = rewards.std(unbiased=False)
    assert float(std) == pytest.approx(0.228, abs=1e-3)
    exact = (rewards[0] - 0.5) / (0.22804 + 1e-4)
    assert torch.allclose(adv, exact, atol=1e-3)
    # The spec prints these rounded to two decimals (exact values -1.315, -0.877, ...).
    assert torch.allclose(adv, torch.tensor([-1.32, 1.32, 0.0, -0.88, 0.88]), atol=5e-3)


def test_dr_grpo_scaling_drops_std() -> None:
    rewards = torch.tensor([[0.2, 0.8, 0.5, 0.3, 0.7]])
    adv = outcome_advantages(rewards, scaling="none")[0]
    assert torch.allclose(adv, torch.tensor([-0.3, 0.3, 0.0, -0.2, 0.2]), atol=1e-6)


group = st.lists(st.floats(-10, 10, allow_nan=False), min_size=2, max_size=8)


@given(st.lists(group, min_size=1, max_size=4).filter(lambda g: len({len(x) for x in g}) == 1))
def test_outcome_advantages_sum_to_zero_per_group(groups: list[list[float]]) -> None:
    rewards = torch.tensor(groups, dtype=torch.float64)
    for scaling in ("group_std", "none"):
        adv = outcome_advantages(rewards, scaling=scaling)
        assert torch.allclose(adv.sum(-1), torch.zeros(len(groups), dtype=torch.float64), atol=1e-6)


@given(st.floats(-10, 10, allow_nan=False), st.integers(2, 16), st.integers(1, 4))
def test_equal_rewards_give_zero_advantage(value: float, size: int, prompts: int) -> None:
    rewards = torch.full((prompts, size), value)
    assert torch.all(outcome_advantages(rewards) == 0)
    assert zero_advantage_group_fraction(rewards) == 1.0


def test_zero_advantage_group_fraction_counts_groups() -> None:
    rewards = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    assert zero_advantage_group_fraction(rewards) == 0.5


def test_process_vector_spec_5() -> None:
    # one output, 7 tokens; steps end at tokens 1, 3, 6 with normalised rewards .5, -.3, .8
    normed = torch.tensor([0.5, -0.3, 0.8])
    ends = torch.tensor([1, 3, 6])
    adv = step_rewards_to_token_advantages(normed, torch.ones(3), ends, torch.ones(7))
    assert torch.allclose(adv, torch.tensor([1.0, 1.0, 0.5, 0.5, 0.8, 0.8, 0.8]), atol=1e-6)


def test_process_advantages_normalise_whole_group() -> None:
    # output 0: steps [1, 0] ending at tokens 0 and 2; output 1: one step [0] ending at 1
    step_rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    step_mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    ends = torch.tensor([[0, 2], [1, 0]])
    response_mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    adv = process_advantages(step_rewards[None], step_mask[None], ends[None], response_mask[None])[
        0
    ]
    mean, std = 1 / 3, (2 / 9) ** 0.5
    hi, lo = (1 - mean) / (std + 1e-4), (0 - mean) / (std + 1e-4)
    expected = torch.tensor([[hi + lo, lo, lo, 0.0], [lo, lo, 0.0, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-5)


def test_process_advantages_of_each_group_are_independent_of_the_others() -> None:
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(3, 4, 5, generator=gen)
    mask = (torch.rand(3, 4, 5, generator=gen) > 0.3).float()
    ends = torch.sort(torch.randint(0, 9, (3, 4, 5), generator=gen), dim=-1).values
    response_mask = torch.ones(3, 4, 9)
    batched = process_advantages(rewards, mask, ends, response_mask)
    for p in range(3):
        one = slice(p, p + 1)
        single = process_advantages(rewards[one], mask[one], ends[one], response_mask[one])
        assert torch.allclose(batched[p], single[0])


def test_step_end_out_of_range_is_an_error() -> None:
    with pytest.raises(ValueError, match="step end"):
        step_rewards_to_token_advantages(
            torch.ones(1), torch.ones(1), torch.tensor([5]), torch.ones(3)
        )


def test_unified_paradigm_worked_example_spec_6() -> None:
    rewards = torch.tensor([[0.9, 0.6, 0.2]])
    correct = torch.tensor([[True, True, False]])
    assert rft_coefficients(correct).tolist() == [[1.0, 1.0, 0.0]]
    assert sft_coefficients(correct).tolist() == [[1.0, 1.0, 1.0]]
    grpo = outcome_advantages(rewards)[0]
    assert grpo[0] > 1.0 and 0 < grpo[1] < 0.5 and grpo[2] < -1.0


def test_registry_names_and_token_broadcast() -> None:
    assert set(ADVANTAGE_ESTIMATORS) == {
        "grpo_outcome",
        "grpo_process",
        "dr_grpo",
        "rft",
        "online_rft",
        "sft",
        "ppo",
        "dpo",
        "dpo_ranked",
        "dpo_file",
        "distill",
    }
    response_mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    inputs = AdvantageInputs(
        response_mask=response_mask,
        rewards=torch.tensor([[1.0, 0.0]]),
        correct=torch.tensor([[True, False]]),
        step_rewards=torch.tensor([[[1.0], [0.0]]]),
        step_mask=torch.ones(1, 2, 1),
        step_ends=torch.tensor([[[1], [0]]]),
    )
    outcome = get_adv_estimator("grpo_outcome")(inputs, 1e-4)
    assert torch.allclose(outcome, torch.tensor([[1.0, 1.0, 0.0], [-1.0, 0.0, 0.0]]), atol=1e-3)
    assert get_adv_estimator("online_rft")(inputs, 1e-4).tolist() == [[1, 1, 0], [0, 0, 0]]
    assert get_adv_estimator("sft")(inputs, 1e-4).tolist() == response_mask.tolist()
    process = get_adv_estimator("grpo_process")(inputs, 1e-4)
    assert torch.allclose(process, outcome, atol=1e-3)
    with pytest.raises(ValueError, match="grpo_outcome"):
        get_adv_estimator("a2c")


@given(st.floats(-10, 10, allow_nan=False), st.integers(1, 5))
def test_equal_step_rewards_give_zero_process_advantage(value: float, steps: int) -> None:
    rewards = torch.full((3, steps), value)
    ends = torch.arange(steps).expand(3, steps)
    adv = process_advantages(
        rewards[None], torch.ones(1, 3, steps), ends[None], torch.ones(1, 3, steps + 1)
    )
    assert torch.all(adv == 0)


def test_near_equal_rewards_keep_advantages_summing_to_zero() -> None:
    # Learned-RM scores that differ in the 7th digit: centred in float32, their rounding
    # (~6e-8) divided by std + eps (~1e-4) left group sums of ~1e-4.
    gen = torch.Generator().manual_seed(0)
    rewards = 0.7310586 + torch.randint(-3, 4, (256, 8), generator=gen).float() * 6e-8
    advantages = outcome_advantages(rewards)
    assert advantages.dtype == torch.float32
    assert float(advantages.sum(dim=-1).abs().max()) < 1e-5


def test_pad_steps_makes_ragged_step_lists_a_masked_group_tensor() -> None:
    from grpo_core.algo.advantages import pad_steps

    rewards, mask, ends = pad_steps(
        [[0.5, 1.0], [], [0.2], [0.1, 0.3]], [[3, 7], [], [4], [2, 9]], (2, 2)
    )
    assert rewards.shape == mask.shape == ends.shape == (2, 2, 2)
    want = torch.tensor([[[0.5, 1.0], [0.0, 0.0]], [[0.2, 0.0], [0.1, 0.3]]])
    assert torch.equal(rewards, want)
    assert mask.tolist() == [[[True, True], [False, False]], [[True, False], [True, True]]]
    assert ends.tolist() == [[[3, 7], [0, 0]], [[4, 0], [2, 9]]]
    assert pad_steps([[], []], [[], []], (1, 2))[1].shape == (1, 2, 1)  # no steps: width 1
    with pytest.raises(ValueError, match="output 0: 2 step rewards but 1 step ends"):
        pad_steps([[0.1, 0.2]], [[3]], (1, 1))
    with pytest.raises(ValueError, match="for a 2 x 2 group batch"):
        pad_steps([[0.1]], [[3]], (2, 2))
