"""The length and credit formulas on hand-computed vectors: DAPO's overlong penalty, Kimi
k1.5's length reward, the per-step length diagnostics, and process supervision's sum (paper)
and min (PURE) credit."""

from __future__ import annotations

import pytest
import torch

from grpo_core.algo.advantages import process_advantages
from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.step import length_stats
from reward_models.parts.length import length_reward
from reward_models.parts.overlong import cache_tokens, overlong_penalty

# ---- overlong penalty ---------------------------------------------------------------------


def test_overlong_penalty_is_zero_then_linear_then_minus_one() -> None:
    # max_len 10, cache 4: free up to 6; 7 -> (6-7)/4 = -0.25, 8 -> -0.5, 10 -> -1; 11 -> -1
    got = overlong_penalty([0, 5, 6, 7, 8, 10, 11], max_len=10, cache=4)
    assert got == [0.0, 0.0, 0.0, -0.25, -0.5, -1.0, -1.0]


def test_overlong_penalty_without_cache_punishes_only_beyond_the_limit() -> None:
    assert overlong_penalty([3, 10, 12], max_len=10, cache=0) == [0.0, 0.0, -1.0]


def test_overlong_penalty_refuses_a_cache_longer_than_the_budget() -> None:
    with pytest.raises(ValueError, match="cache <= max_len"):
        overlong_penalty([1], max_len=4, cache=5)


def test_the_cache_is_a_rounded_share_of_the_budget() -> None:
    assert cache_tokens(20480, 0.2) == 4096  # DAPO's setting
    assert cache_tokens(32, 0.2) == 6  # 6.4 rounds to 6


# ---- length reward (Kimi k1.5) ------------------------------------------------------------


def test_length_reward_by_hand() -> None:
    # group 0 lengths 10, 20, 30, 20: min 10, max 30, span 20
    #   lambda = 0.5 - (len - 10) / 20 = 0.5, 0.0, -0.5, 0.0
    #   correct, correct, correct, wrong -> 0.5, 0.0, -0.5, min(0, 0.0) = 0.0
    # group 1 lengths 4, 8: lambda 0.5, -0.5; both wrong -> min(0, 0.5) = 0, -0.5
    # group 2 lengths 7, 7: equal -> 0, 0
    lengths = [10, 20, 30, 20, 4, 8, 7, 7]
    correct = [True, True, True, False, False, False, True, False]
    groups = [0, 0, 0, 0, 1, 1, 2, 2]
    assert length_reward(lengths, correct, groups) == [0.5, 0.0, -0.5, 0.0, 0.0, -0.5, 0.0, 0.0]


def test_a_short_wrong_output_gets_nothing_a_long_one_is_penalised() -> None:
    # lengths 2, 6, 10 -> lambda 0.5, 0.0, -0.5; all wrong -> 0, 0, -0.5
    assert length_reward([2, 6, 10], [False] * 3, [0, 0, 0]) == [0.0, 0.0, -0.5]


def test_length_reward_needs_one_verdict_per_output() -> None:
    with pytest.raises(ValueError, match="a length, a verdict and a group"):
        length_reward([1, 2], [True], [0, 0])


def test_length_stats_by_hand() -> None:
    # correct: 4 and 6 tokens -> 5; wrong: 9 -> 9; one of three truncated
    stats = length_stats(
        torch.tensor([4, 9, 6]), torch.tensor([1.0, 0.0, 1.0]), torch.tensor([False, True, False])
    )
    assert stats == {
        "truncated_fraction": pytest.approx(1 / 3),
        "length_correct_mean": 5.0,
        "length_wrong_mean": 9.0,
    }


def test_length_stats_leave_out_a_mean_of_nothing() -> None:
    stats = length_stats(torch.tensor([3, 5]), torch.tensor([0.0, 0.0]), torch.tensor([False] * 2))
    assert stats == {"truncated_fraction": 0.0, "length_wrong_mean": 4.0}


# ---- process credit: sum (paper) and min (PURE) -------------------------------------------


def _one_output_credit(credit: str) -> list[float]:
    # one group of two outputs; output 0 has steps [0.9, 0.1, 0.8] ending at tokens 1, 3, 5,
    # output 1 one step 0.4 ending at 2; six response tokens each
    rewards = torch.tensor([[[0.9, 0.1, 0.8], [0.4, 0.0, 0.0]]])
    mask = torch.tensor([[[True, True, True], [True, False, False]]])
    ends = torch.tensor([[[1, 3, 5], [2, 0, 0]]])
    response = torch.ones(1, 2, 6)
    out = process_advantages(rewards, mask, ends, response, eps=0.0, credit=credit)  # type: ignore[arg-type]
    return [round(v, 6) for v in out[0, 0].tolist()]


# group steps 0.9, 0.1, 0.8, 0.4: mean 0.55, population variance
# (0.35^2 + 0.45^2 + 0.25^2 + 0.15^2) / 4 = (0.1225 + 0.2025 + 0.0625 + 0.0225) / 4 = 0.1025
# std 0.320156...; z = 1.093216, -1.405564, 0.780869 (and -0.468521 for output 1)
Z = (0.35 / 0.1025**0.5, -0.45 / 0.1025**0.5, 0.25 / 0.1025**0.5)


def test_sum_credit_by_hand() -> None:
    # tokens 0-1: z1 + z2 + z3 = 0.468521; tokens 2-3: z2 + z3 = -0.624695; tokens 4-5: z3
    first, second, third = sum(Z), Z[1] + Z[2], Z[2]
    expected = [first, first, second, second, third, third]
    assert _one_output_credit("sum") == pytest.approx(expected, abs=1e-5)


def test_min_credit_by_hand() -> None:
    # tokens 0-1: min(z1, z2, z3) = z2 = -1.405564; tokens 2-3: min(z2, z3) = z2; 4-5: z3
    expected = [Z[1], Z[1], Z[1], Z[1], Z[2], Z[2]]
    assert _one_output_credit("min") == pytest.approx(expected, abs=1e-5)


def test_min_credit_gives_zero_after_the_last_step_and_to_padding() -> None:
    rewards = torch.tensor([[[1.0, 0.0], [0.0, 0.0]]])
    mask = torch.tensor([[[True, False], [True, False]]])
    ends = torch.tensor([[[1, 0], [0, 0]]])
    response = torch.tensor([[[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]]])
    out = process_advantages(rewards, mask, ends, response, eps=0.0, credit="min")
    # z-scores of 1 and 0: +1 and -1; output 0's step ends at 1 -> tokens 0, 1; token 2 after
    # the last step: 0; token 3 padding: 0. Output 1's step ends at 0 -> token 0 only.
    assert out[0].tolist() == [[1.0, 1.0, 0.0, 0.0], [-1.0, 0.0, 0.0, 0.0]]


def test_process_credit_refuses_an_unknown_form() -> None:
    with pytest.raises(ValueError, match="'sum' or 'min'"):
        process_advantages(
            torch.zeros(1, 1, 1),
            torch.ones(1, 1, 1),
            torch.zeros(1, 1, 1).long(),
            torch.ones(1, 1, 2),
            credit="max",
        )  # type: ignore[arg-type]


def test_the_config_offers_the_credit_forms_the_formula_knows() -> None:
    from typing import get_args

    from grpo_core.algo import advantages, config

    assert get_args(config.ProcessCredit) == get_args(advantages.ProcessCredit)


def test_min_credit_is_refused_without_step_rewards() -> None:
    with pytest.raises(ValueError, match=r"process_credit = min.*grpo_process"):
        GRPOConfig(process_credit="min")
    assert GRPOConfig(adv_estimator="grpo_process", process_credit="min").process_credit == "min"
    assert GRPOConfig(adv_estimator="dr_grpo", dynamic_sampling=True).dynamic_sampling
