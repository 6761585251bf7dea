"""The curriculum's weight of a pass rate and its seeded weighted draw (docs/curriculum.md)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grpo_core.data.curriculum import (
    CurriculumSettings,
    difficulty_weight,
    question_key,
    weighted_draw,
)


@pytest.mark.parametrize(
    ("correct", "samples", "weight"),
    [
        (0, 0, 1.0),  # never sampled: drawn like a fresh question
        (4, 8, 1.0),  # p = 1/2: 4 * 1/2 * 1/2
        (2, 8, 0.75),  # p = 1/4: 4 * 1/4 * 3/4
        (1, 8, 0.4375),  # p = 1/8: 4 * 1/8 * 7/8
        (8, 8, 0.1),  # always solved: the floor
        (0, 8, 0.1),  # never solved: the floor
        (1, 40, 0.1),  # p = 1/40: 4 * 1/40 * 39/40 = 0.0975, under the floor
    ],
)
def test_weight_is_the_scaled_reward_variance_above_the_floor(
    correct: int, samples: int, weight: float
) -> None:
    assert difficulty_weight(correct, samples, floor=0.1) == pytest.approx(weight)


def test_impossible_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="n_correct <= n_samples"):
        difficulty_weight(3, 2, floor=0.1)


def test_draw_takes_the_largest_keys_first() -> None:
    # random.Random(0) draws u = 0.8444, 0.7580, 0.4206; the keys log(1 - u) / w with w =
    # (1, 2, 1) are -1.861, -0.709, -0.546: index 2 first, then 1, then 0
    assert weighted_draw([1.0, 2.0, 1.0], 3, random.Random(0)) == [2, 1, 0]
    assert weighted_draw([1.0, 2.0, 1.0], 2, random.Random(0)) == [2, 1]


def test_first_draw_follows_the_weights() -> None:
    rng = random.Random(7)
    firsts = Counter(weighted_draw([1.0, 3.0], 1, rng)[0] for _ in range(20000))
    assert firsts[1] / 20000 == pytest.approx(0.75, abs=0.015)


@given(
    weights=st.lists(st.floats(min_value=1e-3, max_value=10.0), min_size=1, max_size=40),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_draw_is_distinct_in_range_and_seeded(
    weights: list[float], seed: int, data: st.DataObject
) -> None:
    count = data.draw(st.integers(0, len(weights)))
    picked = weighted_draw(weights, count, random.Random(seed))
    assert len(picked) == count == len(set(picked))
    assert all(0 <= i < len(weights) for i in picked)
    assert weighted_draw(weights, count, random.Random(seed)) == picked


def test_draw_refuses_too_many_or_non_positive_weights() -> None:
    with pytest.raises(ValueError, match="cannot draw 3 of 2"):
        weighted_draw([1.0, 1.0], 3, random.Random(0))
    with pytest.raises(ValueError, match="positive"):
        weighted_draw([1.0, 0.0], 1, random.Random(0))


def test_question_key_depends_on_the_text_only() -> None:
    assert question_key("1 + 2 = ?") == question_key("1 + 2 = ?")
    assert question_key("1 + 2 = ?") != question_key("2 + 1 = ?")


def test_settings_default_off_and_bounded() -> None:
    assert CurriculumSettings().mode == "off"
    with pytest.raises(ValueError, match="floor"):
        CurriculumSettings(floor=0.0)
