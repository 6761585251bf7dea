"""The per-iteration reward-model health lines: label balance and AUROC (retrained and
stale), rounded, built from the rows the stages store."""

from __future__ import annotations

from typing import Any

from flows.stages.health_lines import auroc_line, label_balance_line
from reward_models.labelling import OrmLabel, PrmLabel


def _prm(hard: int) -> PrmLabel:
    return PrmLabel("p", 0, 0, "step", 3, 4, 4 * hard, hard, float(hard))


def test_label_balance_counts_correct_outputs_and_steps() -> None:
    orm = [OrmLabel("p", i, label) for i, label in enumerate([1, 0, 0, 0, 0])]
    prm = [_prm(h) for h in (1, 1, 0, 1)]
    assert label_balance_line(orm, prm) == (
        "labels: ORM 1 of 5 outputs correct (20%); PRM 3 of 4 steps correct (75%)"
    )


def test_one_class_labels_read_as_zero_percent() -> None:
    orm = [OrmLabel("p", i, 0) for i in range(24)]
    assert label_balance_line(orm, []) == "labels: ORM 0 of 24 outputs correct (0%)"
    assert label_balance_line([], []) == "labels: ORM no outputs"


def _row(metric: str, split: str, value: float) -> dict[str, Any]:
    return {"policy_iteration": 1, "split": split, "metric": metric, "k": None, "value": value}


def test_auroc_line_pairs_retrained_with_stale_per_split_rounded() -> None:
    rows = [
        _row("orm_auroc", "train", 0.71234567891234),
        _row("orm_accuracy", "train", 0.5),  # not an AUROC: not in the line
        _row("orm_auroc_stale", "train", 0.65),
        _row("orm_auroc", "test", 0.6899999),
        _row("prm_step_auroc", "train", 0.55),
        _row("prm_step_auroc_stale", "test", 0.4),  # RM_k undefined on test, RM_{k-1} not
    ]
    assert auroc_line(rows) == (
        "AUROC: ORM train 0.712 (stale 0.650), test 0.690; "
        "PRM step train 0.550, test undefined (stale 0.400)"
    )


def test_auroc_line_when_every_auroc_is_undefined() -> None:
    assert auroc_line([_row("orm_accuracy", "train", 0.0)]) == (
        "AUROC: undefined (the fresh outputs are all correct or all wrong)"
    )
