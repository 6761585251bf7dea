import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grpo_core.contracts.rollout import RolloutBatch, SamplingParams
from grpo_core.data.tasks.arith import ArithTask
from grpo_core.data.tasks.base import Problem
from grpo_core.model.config import EvalConfig
from grpo_core.model.evaluate import (
    clustered_mean_se,
    evaluate_policy,
    maj_at_k,
    majority_answer,
    paired_difference,
    pass_at_k,
)
from grpo_core.model.policy import build_char_tokenizer


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6])
def test_pass_at_k_equals_brute_force_over_subsets(n: int) -> None:
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(outcomes, k))
            brute = sum(any(s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)


def test_pass_at_k_stable_for_large_n() -> None:
    assert pass_at_k(1000, 1, 1) == pytest.approx(0.001)
    assert pass_at_k(1000, 10, 100) == pytest.approx(1 - math.comb(990, 100) / math.comb(1000, 100))
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(4, 1, 5)


def test_majority_tie_goes_to_answer_seen_first() -> None:
    assert majority_answer(["7", "5", "5", "7"]) == "7"
    assert majority_answer([None, "5", "7", "7", "5"]) == "5"
    assert majority_answer(["1,000", "1000", "3", "3", "3"]) == "3"
    assert majority_answer([None, None]) is None


def test_maj_at_k_uses_first_k_and_ignores_missing_answers() -> None:
    answers = [None, None, "4", "5", "5", "5"]
    assert maj_at_k(answers, "4", 1) == 0.0
    assert maj_at_k(answers, "4", 3) == 1.0
    assert maj_at_k(answers, "4", 4) == 1.0  # tie 4 vs 5: 4 came first
    assert maj_at_k(answers, "5", 6) == 1.0


def test_default_ks_are_powers_of_two() -> None:
    assert EvalConfig(n_samples=8).k_values() == [1, 2, 4, 8]
    assert EvalConfig(n_samples=6).k_values() == [1, 2, 4]
    with pytest.raises(ValueError, match=r"1\.\.n_samples"):
        EvalConfig(n_samples=4, ks=[8]).k_values()


class ScriptedEngine:
    """Greedy answers `greedy`; sample j of prompt i answers `samples[i][j]`."""

    def __init__(self, greedy: list[str], samples: list[list[str]]) -> None:
        self.greedy, self.samples = greedy, samples

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        texts = self.greedy if params.temperature == 0 else [t for row in self.samples for t in row]
        return RolloutBatch(
            prompt_index=[r // n for r in range(len(texts))],
            prompt_ids=[[1]] * len(texts),
            completion_ids=[[0] * len(t) for t in texts],
            texts=texts,
            finish_reasons=["stop"] * len(texts),
            logprobs=[[0.0] * len(t) for t in texts],
        )


def test_evaluate_policy_reports_paper_metrics() -> None:
    problems = [Problem("a", "1+1", "2"), Problem("b", "2+2", "4")]
    engine = ScriptedEngine(
        greedy=["#### 2", "#### 5"],
        samples=[["#### 2", "#### 3", "#### 3", "#### 2"], ["x", "#### 4", "#### 5", "#### 6"]],
    )
    evaluation = evaluate_policy(
        engine, build_char_tokenizer(), ArithTask(), problems, EvalConfig(n_samples=4), seed=0
    )
    rows = evaluation.metrics
    got = {(r.metric, r.k): r.value for r in rows}
    assert got[("greedy_accuracy", 1)] == 0.5
    assert got[("sampled_accuracy", 1)] == pytest.approx((2 / 4 + 1 / 4) / 2)
    assert got[("format_rate", 1)] == pytest.approx(7 / 8)
    assert got[("pass@k", 4)] == 1.0
    assert got[("pass@k", 1)] == pytest.approx(got[("sampled_accuracy", 1)])
    # maj@2 blocks: a: [2,3]->2 ok, [3,2]->3 no; b: [x,4]->4 ok, [5,6]->5 no
    assert got[("maj@k", 2)] == 0.5
    assert got[("maj@k", 4)] == 1.0  # ties go to the answer seen first: a -> 2, b -> 4
    se = next(r.stderr for r in rows if r.metric == "greedy_accuracy")
    assert se == pytest.approx(0.5)
    # Each problem's value, in problem order; their mean is the metric's row.
    per = {(s.metric, s.k, s.problem_id): s.value for s in evaluation.problems}
    assert (per[("greedy_accuracy", 1, "a")], per[("greedy_accuracy", 1, "b")]) == (1.0, 0.0)
    assert (per[("maj@k", 2, "a")], per[("maj@k", 2, "b")]) == (0.5, 0.5)
    assert (per[("sampled_accuracy", 1, "a")], per[("pass@k", 4, "b")]) == (0.5, 1.0)
    assert [s.index for s in evaluation.problems if s.metric == "pass@k" and s.k == 2] == [0, 1]
    for metric, k in {(s.metric, s.k) for s in evaluation.problems}:
        values = [s.value for s in evaluation.problems if (s.metric, s.k) == (metric, k)]
        assert sum(values) / len(values) == pytest.approx(got[(metric, k)])
    assert {s.metric for s in evaluation.problems} == {
        "greedy_accuracy",
        "sampled_accuracy",
        "pass@k",
        "maj@k",
    }


def test_clustered_se_by_hand() -> None:
    # mean 0.6; cluster residual sums a: 0.4 + 0.4, b: -0.6, c: 0.4 - 0.6; 3 clusters:
    # se^2 = 3/2 * (0.64 + 0.36 + 0.04) / 5^2 = 0.0624
    mean, se = clustered_mean_se([1.0, 1.0, 0.0, 1.0, 0.0], ["a", "a", "b", "c", "c"])
    assert mean == pytest.approx(0.6)
    assert se == pytest.approx(math.sqrt(0.0624))
    assert clustered_mean_se([1.0, 0.0, 1.0], ["q", "q", "q"]) == (pytest.approx(2 / 3), 0.0)
    with pytest.raises(ValueError, match="one cluster per value"):
        clustered_mean_se([1.0, 0.0], ["a"])


VALUES = st.lists(st.floats(-100, 100), min_size=2, max_size=30)


@given(VALUES)
def test_clustered_se_of_distinct_values_is_the_usual_one(values: list[float]) -> None:
    n = len(values)
    mean = sum(values) / n
    usual = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)
    got_mean, got_se = clustered_mean_se(values, list(range(n)))
    assert got_mean == pytest.approx(mean, abs=1e-9)
    assert got_se == pytest.approx(usual, rel=1e-9, abs=1e-9)


@given(VALUES, st.integers(2, 5))
def test_repeating_every_question_leaves_the_clustered_se_unchanged(
    values: list[float], repeats: int
) -> None:
    once = clustered_mean_se(values, list(range(len(values))))
    repeated = [v for v in values for _ in range(repeats)]
    clusters = [i for i in range(len(values)) for _ in range(repeats)]
    again = clustered_mean_se(repeated, clusters)
    assert again[0] == pytest.approx(once[0], abs=1e-9)
    assert again[1] == pytest.approx(once[1], rel=1e-9, abs=1e-9)


def test_paired_difference_by_hand() -> None:
    # differences 1, 0, 0, 1 (mean 0.5); residual sums x: 0.5 - 0.5, y: -0.5, z: 0.5;
    # se^2 = 3/2 * (0 + 0.25 + 0.25) / 4^2
    mean, se = paired_difference([1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0], "xxyz")
    assert mean == pytest.approx(0.5)
    assert se == pytest.approx(math.sqrt(1.5 * 0.5 / 16))
    # each accuracy spreads over the questions; their difference does not
    assert paired_difference([1.0, 0.0, 1.0], [0.5, -0.5, 0.5], "abc") == (
        pytest.approx(0.5),
        0.0,
    )
    with pytest.raises(ValueError, match="got 2, 3 and 3"):
        paired_difference([1.0, 0.0], [1.0, 0.0, 1.0], "abc")


@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1), st.integers(0, 4)), min_size=2))
def test_swapping_the_policies_negates_the_paired_difference(
    problems: list[tuple[float, float, int]],
) -> None:
    a, b, questions = (list(column) for column in zip(*problems, strict=True))
    forward, backward = paired_difference(a, b, questions), paired_difference(b, a, questions)
    assert backward[0] == pytest.approx(-forward[0], abs=1e-12)
    assert backward[1] == pytest.approx(forward[1], abs=1e-12)


def test_a_question_drawn_twice_counts_once_in_the_standard_errors() -> None:
    a, b = Problem("a", "1+1", "2"), Problem("b", "2+2", "4")
    a_again = Problem("a2", "1+1", "2")
    greedy = {"a": "#### 2", "b": "#### 5"}
    samples = {"a": ["#### 2", "#### 3"], "b": ["#### 4", "#### 4"]}

    def evaluate(problems: list[Problem]) -> dict[str, float]:
        keys = [p.problem_id[0] for p in problems]
        engine = ScriptedEngine([greedy[k] for k in keys], [samples[k] for k in keys])
        cfg = EvalConfig(n_samples=2)
        rows = evaluate_policy(engine, build_char_tokenizer(), ArithTask(), problems, cfg, 0)
        return {r.metric: r.stderr for r in rows.metrics if r.k == 1}

    distinct, repeated = evaluate([a, b]), evaluate([a, b, a_again])
    # Greedy right on 1+1 only. Distinct: the usual s.e., 0.5. Repeated: mean 2/3, residual
    # sums 2/3 and -2/3, se^2 = 2 * (8/9) / 3^2, se = 4/9 (the plain s.e. of the 3 draws: 1/3).
    assert distinct["greedy_accuracy"] == pytest.approx(0.5)
    assert repeated["greedy_accuracy"] == pytest.approx(4 / 9)
    assert distinct["sampled_accuracy"] == pytest.approx(0.25)
    assert repeated["format_rate"] == distinct["format_rate"] == 0.0  # per sample, all end in ####
