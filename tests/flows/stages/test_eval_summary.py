"""The evaluate stage's one-line summary names K-metrics by the K they were measured at."""

from flows.stages.evaluate import eval_summary


def test_k_metrics_are_reported_at_the_largest_k_with_k_in_the_name() -> None:
    rows = [
        {"metric": "greedy_accuracy", "k": None, "value": 0.5},
        {"metric": "sampled_accuracy", "k": None, "value": 0.3},
        {"metric": "pass@k", "k": 1, "value": 0.3},
        {"metric": "pass@k", "k": 8, "value": 0.9},
        {"metric": "maj@k", "k": 1, "value": 0.3},
        {"metric": "maj@k", "k": 8, "value": 0.4},
    ]
    assert eval_summary(rows) == {
        "greedy_accuracy": 0.5,
        "sampled_accuracy": 0.3,
        "pass@8": 0.9,
        "maj@8": 0.4,
    }


def test_no_k_metrics_leaves_scalars_only() -> None:
    assert eval_summary([{"metric": "orm_auroc", "k": None, "value": 0.7}]) == {"orm_auroc": 0.7}
