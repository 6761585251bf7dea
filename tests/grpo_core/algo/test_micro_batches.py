"""Micro-batches by token budget: the plan, its padding share, the ranks' passes."""

import logging

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_core.algo import micro_batches
from grpo_core.algo.micro_batches import (
    attended_columns,
    padding_share,
    plan_micro_batches,
    rank_token_micro_batches,
)
from grpo_core.contracts.policy_batch import build_policy_batch


def test_rows_are_packed_longest_first_within_the_budget() -> None:
    # sorted: row 1 (100), row 4 (60), rows 2 and 3 (30), row 0 (5)
    # [1]: 2 x 100 > 120; [4, 2]: 2 x 60 = 120; [3, 0]: 2 x 30 = 60
    assert plan_micro_batches([5, 100, 30, 30, 60], 120) == [[1], [4, 2], [3, 0]]


def test_a_large_budget_is_one_micro_batch_and_a_budget_of_one_row_each() -> None:
    assert plan_micro_batches([3, 1, 2], 1000) == [[0, 2, 1]]
    assert plan_micro_batches([3, 1, 2], 3) == [[0], [2], [1]]
    assert plan_micro_batches([], 10) == []


def test_a_row_over_the_budget_runs_alone_and_is_noted_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    micro_batches._BUDGETS_NOTED.discard(77)
    rows = torch.arange(3)
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            passes = rank_token_micro_batches(rows, [300, 10, 20], 77)
    assert [p.tolist() for p, _ in passes] == [[0], [2, 1]]
    notes = [r for r in caplog.records if "max_tokens_per_micro_batch = 77" in r.message]
    assert len(notes) == 1 and "300 tokens" in notes[0].message


def test_a_budget_below_one_is_an_error() -> None:
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        plan_micro_batches([1], 0)


def test_padding_share_counts_positions_each_micro_batch_pads() -> None:
    lengths = [4, 2, 1, 1]
    # [0, 1]: 8 positions, 6 tokens; [2, 3]: 2 positions, 2 tokens
    assert padding_share(lengths, [[0, 1], [2, 3]]) == pytest.approx(1 - 8 / 10)
    # fixed rows keep the whole batch's 4 columns: 16 positions
    assert padding_share(lengths, [[0, 1], [2, 3]], width=4) == pytest.approx(1 - 8 / 16)
    assert padding_share([], []) == 0.0


def test_attended_columns_leave_out_padding_on_either_side() -> None:
    left = build_policy_batch([[1, 2], [3]], [[4], []], pad_id=0, padding_side="left")
    right = build_policy_batch([[1, 2], [3]], [[4], []], pad_id=0, padding_side="right")
    assert attended_columns(left.select(torch.tensor([1]))) == slice(2, 3)
    assert attended_columns(right.select(torch.tensor([1]))) == slice(0, 1)
    assert attended_columns(right) == slice(0, 3)


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=1, max_value=4000), max_size=60),
    budget=st.integers(min_value=1, max_value=9000),
)
def test_every_row_once_within_budget_in_a_fixed_order(lengths: list[int], budget: int) -> None:
    plan = plan_micro_batches(lengths, budget)
    assert sorted(row for rows in plan for row in rows) == list(range(len(lengths)))
    for rows in plan:
        width = max(lengths[row] for row in rows)
        assert len(rows) * width <= budget or len(rows) == 1
    widths = [max(lengths[row] for row in rows) for rows in plan]
    assert widths == sorted(widths, reverse=True)  # longest micro-batch first
    assert plan_micro_batches(list(lengths), budget) == plan  # deterministic
    assert padding_share(lengths, plan) <= padding_share(
        lengths, [list(range(len(lengths)))], width=max(lengths, default=0)
    )


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=1, max_value=500), min_size=1, max_size=40),
    budget=st.integers(min_value=1, max_value=2000),
    world=st.integers(min_value=1, max_value=4),
)
def test_ranks_run_equal_pass_counts_and_every_row_once(
    lengths: list[int], budget: int, world: int
) -> None:
    rows = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(0))
    shares = [rank_token_micro_batches(rows, lengths, budget, r, world) for r in range(world)]
    assert len({len(passes) for passes in shares}) == 1  # ZeRO passes are collective
    live = [
        row for passes in shares for part, is_live in passes if is_live for row in part.tolist()
    ]
    assert sorted(live) == list(range(len(lengths)))
