"""RM evaluation metrics: AUROC with ties and its bootstrap interval, accuracy, majority
baseline, best-of-N, eval rows."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reward_models.evaluate import (
    AurocInterval,
    EvalRow,
    accuracy,
    auroc,
    best_of_n_accuracy,
    best_of_n_rows,
    bootstrap_auroc,
    majority_baseline,
    orm_eval_rows,
    orm_pair_rows,
    pair_hits,
    pairwise_accuracy,
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
    # every resample keeps the three correct outputs above the wrong one: a zero-width interval
    assert rows[0] == EvalRow("test", "orm_auroc", None, 1.0, 0.0, 4, ci_low=1.0, ci_high=1.0)
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


def test_bootstrap_auroc_on_a_hand_enumerated_case() -> None:
    # One positive (0.5) between two negatives (0.2, 0.8): AUROC 0.5. Of the 27 equally likely
    # draws of 3 outputs, 18 hold both classes; their AUROC is the drawn share of the 0.2
    # negative: 1, 0.5 and 0 with 6 draws each. Mean 0.5, variance 5/12 - 1/4 = 1/6.
    got = bootstrap_auroc([0.5, 0.2, 0.8], [1, 0, 0], resamples=20_000)
    assert got is not None
    assert got.estimate == 0.5
    assert got.stderr == pytest.approx(math.sqrt(1 / 6), abs=0.01)
    assert (got.low, got.high) == (0.0, 1.0)
    perfect = bootstrap_auroc([0.9, 0.8, 0.1, 0.3], [1, 1, 0, 0])
    assert perfect == AurocInterval(1.0, 0.0, 1.0, 1.0)  # every resample separates them
    assert bootstrap_auroc([0.9, 0.1], [1, 1]) is None  # one class: no AUROC


scored_outputs = st.lists(
    st.tuples(st.integers(0, 6).map(lambda v: v / 6), st.integers(0, 1)),
    min_size=4,
    max_size=40,
).filter(lambda pairs: 2 <= sum(y for _, y in pairs) <= len(pairs) - 2)


@given(scored_outputs)
def test_bootstrap_interval_holds_the_estimate_and_narrows_with_more_outputs(
    pairs: list[tuple[float, int]],
) -> None:
    scores, labels = [s for s, _ in pairs], [y for _, y in pairs]
    once = bootstrap_auroc(scores, labels)
    assert once is not None
    assert once.estimate == pytest.approx(auroc(scores, labels))
    assert once.low <= once.estimate <= once.high
    # the same outputs four times over: the same AUROC, known about twice as precisely
    more = bootstrap_auroc(scores * 4, labels * 4)
    assert more is not None and more.estimate == pytest.approx(once.estimate)
    if once.stderr > 0:
        assert more.stderr < 0.7 * once.stderr
        assert more.high - more.low < once.high - once.low


@given(scored_outputs, st.integers(2, 4))
def test_bootstrap_resamples_whole_outputs(pairs: list[tuple[float, int]], copies: int) -> None:
    # Each output's step repeated: resampling outputs gives the same interval as one step
    # per output; resampling steps as if independent would narrow it.
    scores, labels = [s for s, _ in pairs], [y for _, y in pairs]
    once = bootstrap_auroc(scores, labels)
    owner = [i for i in range(len(pairs)) for _ in range(copies)]
    stepwise = bootstrap_auroc(
        [s for s in scores for _ in range(copies)],
        [y for y in labels for _ in range(copies)],
        groups=owner,
    )
    assert once is not None and stepwise is not None
    assert stepwise.low == pytest.approx(once.low) and stepwise.high == pytest.approx(once.high)
    assert stepwise.stderr == pytest.approx(once.stderr)


def test_auroc_rows_carry_the_interval_and_prm_rows_resample_outputs() -> None:
    (row, *_) = orm_eval_rows([0.9, 0.2, 0.6, 0.4, 0.5], [1, 0, 1, 0, 0], split="test")
    assert row.value == pytest.approx(auroc([0.9, 0.2, 0.6, 0.4, 0.5], [1, 0, 1, 0, 0]))
    assert row.ci_low is not None and row.ci_high is not None and row.stderr is not None
    assert row.ci_low <= row.value <= row.ci_high
    steps, step_labels = [[0.9, 0.8], [0.3], [0.6, 0.2]], [[1, 1], [0], [1, 0]]
    (prm, *_) = prm_eval_rows(steps, step_labels, split="test")
    expected = bootstrap_auroc([0.9, 0.8, 0.3, 0.6, 0.2], [1, 1, 0, 1, 0], groups=[0, 0, 1, 2, 2])
    assert expected is not None
    assert (prm.ci_low, prm.ci_high, prm.stderr) == (expected.low, expected.high, expected.stderr)


def test_accuracy_standard_errors_are_over_questions_by_hand() -> None:
    # Outputs of questions a, a, b, c, c, c; correct-at-0.5 hits 1, 1, 0, 1, 0, 1 (mean 2/3).
    # Residuals summed per question: a 2/3, b -2/3, c 0; se^2 = 3/2 * (8/9) / 36 = 1/27.
    probs = [0.9, 0.8, 0.7, 0.6, 0.6, 0.2]
    labels = [1, 1, 0, 1, 0, 0]
    rows = {r.metric: r for r in orm_eval_rows(probs, labels, "test", list("aabccc"))}
    assert rows["orm_accuracy"].value == pytest.approx(2 / 3)
    assert rows["orm_accuracy"].stderr == pytest.approx(math.sqrt(1 / 27))
    # Without question names each output is its own: s / sqrt(n) = sqrt((4/3) / 5 / 6).
    (_, alone, _) = orm_eval_rows(probs, labels, "test")
    assert alone.stderr == pytest.approx(math.sqrt(4 / 3 / 5 / 6))
    with pytest.raises(ValueError, match="5 questions for 6 outputs"):
        orm_eval_rows(probs, labels, "test", list("aabcc"))


@given(scored_outputs, st.integers(2, 4))
def test_a_question_drawn_k_times_counts_once(pairs: list[tuple[float, int]], k: int) -> None:
    # Each output's question drawn k times with the same outputs (the drift measurement's
    # repeats): AUROC interval and accuracy s.e. as for one draw of each, not sqrt(k) narrower.
    scores, labels = [s for s, _ in pairs], [y for _, y in pairs]
    names = [f"q{i}" for i in range(len(pairs))]
    once = orm_eval_rows(scores, labels, "test", names)
    repeated = orm_eval_rows(scores * k, labels * k, "test", names * k)
    for one, many in zip(once, repeated, strict=True):
        assert many.value == pytest.approx(one.value) and many.n == k * one.n
        assert many.stderr == pytest.approx(one.stderr)
    if once[1].stderr:  # named as separate outputs, the repeats would look k times as many
        (_, unnamed, _) = orm_eval_rows(scores * k, labels * k, "test")
        assert unnamed.stderr is not None and unnamed.stderr < once[1].stderr


def test_best_of_n_and_prm_rows_cluster_by_question() -> None:
    # Two prompts of question a (best-of-2 hits 1, 1) and one of b (0): mean 2/3; residuals
    # a 2/3, b -2/3; se^2 = 2 * (8/9) / 9 = 16/81.
    scores = [[0.9, 0.1], [0.8, 0.2], [0.7, 0.3]]
    correct = [[1, 0], [1, 1], [0, 1]]
    best, sample = best_of_n_rows(scores, correct, "test", ["a", "a", "b"])
    assert best.value == pytest.approx(2 / 3) and best.stderr == pytest.approx(4 / 9)
    # samples: a holds 1, 0, 1, 1 and b 0, 1 (mean 2/3): residuals a 1/3, b -1/3;
    # se^2 = 2 * (2/9) / 36 = 1/81.
    assert sample.value == pytest.approx(2 / 3) and sample.stderr == pytest.approx(1 / 9)
    # PRM: steps of outputs of questions a, a, b; hits (p >= 0.5 == label) 1, 1 | 0 | 1, 1.
    steps, step_labels = [[0.9, 0.8], [0.3], [0.6, 0.2]], [[1, 1], [1], [1, 0]]
    rows = {r.metric: r for r in prm_eval_rows(steps, step_labels, "test", ["a", "a", "b"])}
    # mean 4/5; residuals a 1/5 + 1/5 - 4/5 = -2/5, b 2/5; se^2 = 2 * (8/25) / 25
    assert rows["prm_step_accuracy"].value == pytest.approx(4 / 5)
    assert rows["prm_step_accuracy"].stderr == pytest.approx(math.sqrt(16 / 625))
    expected = bootstrap_auroc(
        [0.9, 0.8, 0.3, 0.6, 0.2], [1, 1, 1, 1, 0], groups=["a", "a", "a", "b", "b"]
    )
    assert expected is not None
    assert rows["prm_step_auroc"].stderr == expected.stderr


def test_pairwise_accuracy_by_hand_with_ties_as_half() -> None:
    scores = [0.9, 0.2, 0.5, 0.5, 0.1, 0.7, 0.3]
    labels = [1, 0, 1, 0, 1, 0, 1]
    groups = ["a", "a", "a", "a", "b", "b", "c"]  # c has no wrong output: no pair
    hits, owners = pair_hits(scores, labels, groups)
    # a: 0.9 > 0.2, 0.9 > 0.5, 0.5 > 0.2, 0.5 = 0.5 (half); b: 0.1 < 0.7
    assert hits.tolist() == [1.0, 1.0, 1.0, 0.5, 0.0] and owners == ["a"] * 4 + ["b"]
    assert pairwise_accuracy(scores, labels, groups) == pytest.approx(3.5 / 5)
    (row,) = orm_pair_rows(scores, labels, "test", groups)
    # clustered by question (docs/algorithm.md section 8): C = 2, mean 0.7 over 5 pairs,
    # se^2 = 2 * ((3.5 - 4 * 0.7)^2 + (0 - 0.7)^2) / 5^2
    assert (row.metric, row.value, row.n) == ("orm_pair_accuracy", pytest.approx(0.7), 5)
    assert row.stderr == pytest.approx(math.sqrt(2 * (0.7**2 + 0.7**2) / 25))
    assert math.isnan(pairwise_accuracy([0.3, 0.4], [1, 1], ["a", "a"]))
    assert orm_pair_rows([0.3, 0.4], [1, 0], "test", ["a", "b"]) == []  # no question has a pair


@given(scored_outputs)
def test_pairwise_accuracy_of_one_question_is_its_auroc(pairs: list[tuple[float, int]]) -> None:
    scores, labels = [s for s, _ in pairs], [y for _, y in pairs]
    assert pairwise_accuracy(scores, labels, ["q"] * len(pairs)) == pytest.approx(
        pairwise_auroc(scores, labels)
    )
