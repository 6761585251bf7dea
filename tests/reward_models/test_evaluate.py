"""RM evaluation metrics: AUROC with ties, accuracy, majority baseline, best-of-N, eval rows."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reward_models.evaluate import (
    EvalRow,
    accuracy,
    auroc,
    best_of_n_accuracy,
    best_of_n_rows,
    majority_baseline,
    orm_eval_rows,
    prm_eval_rows,
)


def pairwise_auroc(scores: list[float], labels: list[int]) -> float:
    pos = [s for s, y in zip(scores, labels, strict=True) if y == 1]
    neg = [s for s, y in zip(scores, labels, strict=True) if y == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


@given(
    st.lists(
        st.tuples(st.integers(0, 4).map(lambda v: v / 4), st.integers(0, 1)),
        min_size=2,
        max_size=40,
    ).filter(lambda pairs: 0 < sum(y for _, y in pairs) < len(pairs))
)
def test_auroc_equals_the_pairwise_count_with_ties_as_half(pairs: list[tuple[float, int]]) -> None:
    scores, labels = [s for s, _ in pairs], [y for _, y in pairs]
    assert auroc(scores, labels) == pytest.approx(pairwise_auroc(scores, labels))


def test_auroc_examples() -> None:
    assert auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert auroc([0.5, 0.5, 0.5], [0, 1, 1]) == pytest.approx(0.5)
    assert math.isnan(auroc([0.2, 0.9], [1, 1]))
    with pytest.raises(ValueError, match="NaN"):
        auroc([math.nan, 0.1], [0, 1])


def test_accuracy_and_majority_baseline() -> None:
    assert accuracy([0.9, 0.2, 0.5, 0.4], [1, 0, 0, 1]) == pytest.approx(0.5)
    assert majority_baseline([1, 1, 1, 0]) == pytest.approx(0.75)
    assert majority_baseline([0, 0, 1]) == pytest.approx(2 / 3)


def test_best_of_n_takes_the_top_scored_sample_and_splits_ties() -> None:
    scores = [[0.9, 0.1, 0.3], [0.2, 0.7, 0.7], [0.5, 0.5, 0.5]]
    correct = [[1, 0, 0], [0, 1, 0], [1, 0, 0]]
    assert best_of_n_accuracy(scores, correct) == pytest.approx((1 + 0.5 + 1 / 3) / 3)


def test_eval_rows_have_the_eval_table_shape() -> None:
    rows = orm_eval_rows([0.9, 0.2, 0.6, 0.4], [1, 0, 1, 1], split="test")
    assert [r.metric for r in rows] == ["orm_auroc", "orm_accuracy", "orm_majority_baseline"]
    assert rows[0] == EvalRow("test", "orm_auroc", None, 1.0, rows[0].stderr, 4)
    prm = prm_eval_rows([[0.9, 0.8], [0.3]], [[1, 0], [0]], split="test")
    assert [(r.metric, r.value, r.n) for r in prm] == [
        ("prm_step_auroc", 1.0, 3),  # the one correct step outscores both wrong ones
        ("prm_step_accuracy", pytest.approx(2 / 3), 3),
        ("prm_step_majority_baseline", pytest.approx(2 / 3), 3),
    ]
    bon = best_of_n_rows([[0.9, 0.1], [0.2, 0.8]], [[1, 0], [1, 0]], split="test")
    assert [(r.metric, r.k, r.value, r.n) for r in bon] == [
        ("best_of_n_accuracy", 2, 0.5, 2),
        ("sample_accuracy", 2, 0.5, 4),
    ]
    with pytest.raises(ValueError, match="step scores"):
        prm_eval_rows([[0.9]], [[1, 0]], split="test")
