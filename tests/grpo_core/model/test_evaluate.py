import itertools
import math

import pytest

from grpo_core.contracts.rollout import RolloutBatch, SamplingParams
from grpo_core.data.tasks.arith import ArithTask
from grpo_core.data.tasks.base import Problem
from grpo_core.model.config import EvalConfig
from grpo_core.model.evaluate import evaluate_policy, maj_at_k, majority_answer, pass_at_k
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
