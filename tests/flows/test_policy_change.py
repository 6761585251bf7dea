"""What a run prints under its table: the last policy against policy_0, paired by problem,
standard errors over questions (flows/policy_change.py), read from a store written by hand."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from flows.names import EVALUATE, WARM_START
from flows.policy_change import MetricChange, format_policy_change, policy_change
from storage.store import RunStore

QUESTIONS = ["q", "q", "r", "s"]  # problem 1 is question q drawn again


def problem_rows(
    policy: int, metric: str, k: int, values: list[float], ids: str = "abcd"
) -> list[dict[str, Any]]:
    return [
        {"policy_iteration": policy, "split": "test", "problem_index": i, "problem_id": ids[i]}
        | {"metric": metric, "k": k, "value": v, "question": QUESTIONS[i]}
        for i, v in enumerate(values)
    ]


def write_policies(root: Path, by_policy: dict[int, list[dict[str, Any]]]) -> RunStore:
    store = RunStore(root)
    with store.open_run("r", {}) as run:
        for policy, rows in sorted(by_policy.items()):
            stage, iteration = (WARM_START, 0) if policy == 0 else (EVALUATE, policy - 1)
            with run.stage(iteration, stage) as attempt:
                attempt.write("eval_problems", rows)
    return store


def policy_rows(
    policy: int, greedy: list[float], sampled: list[float], maj8: list[float]
) -> list[dict[str, Any]]:
    return [
        *problem_rows(policy, "greedy_accuracy", 1, greedy),
        *problem_rows(policy, "sampled_accuracy", 1, sampled),
        *problem_rows(policy, "maj@k", 4, [1.0, 1.0, 1.0, 1.0]),
        *problem_rows(policy, "maj@k", 8, maj8),
    ]


def test_the_last_policy_against_policy_0_by_hand(tmp_path: Path) -> None:
    store = write_policies(
        tmp_path,
        {
            0: policy_rows(0, [1, 0, 0, 1], [0.5, 0.5, 0.25, 0.75], [0, 0, 1, 1]),
            1: policy_rows(1, [0, 0, 0, 0], [0.0, 0.0, 0.0, 0.0], [0, 0, 0, 0]),  # not the last
            2: policy_rows(2, [1, 1, 1, 0], [0.75, 0.75, 0.5, 1.0], [1, 0, 1, 1]),
        },
    )
    change = policy_change(store, "r")
    assert change is not None
    assert (change.policy, change.problems, change.questions) == (2, 4, 3)
    greedy, sampled, maj = change.metrics
    # greedy differences 0, 1, 1, -1: mean 0.25; residuals by question q: -0.25 + 0.75,
    # r: 0.75, s: -1.25; se^2 = 3/2 * (0.25 + 0.5625 + 1.5625) / 4^2
    assert (greedy.label, greedy.mean) == ("greedy", pytest.approx(0.25))
    assert greedy.se == pytest.approx(math.sqrt(1.5 * 2.375 / 16))
    # every problem up 0.25: no spread to measure
    assert (sampled.label, sampled.mean, sampled.se) == ("sampled", pytest.approx(0.25), 0.0)
    # Maj@8 (the largest K): differences 1, 0, 0, 0; residuals q: 0.75 - 0.25, r, s: -0.25
    assert (maj.label, maj.mean) == ("Maj@8", pytest.approx(0.25))
    assert maj.se == pytest.approx(math.sqrt(1.5 * 0.375 / 16))
    assert format_policy_change(change) == (
        "policy_2 - policy_0 on the same 4 test problems (3 questions), paired, "
        "± 1 s.e. over questions:\n"
        "greedy +0.250±0.472 (+0.5 s.e.)  sampled +0.250 (the same change on every question)"
        "  Maj@8 +0.250±0.188 (+1.3 s.e.)"
    )


def test_metrics_not_evaluated_on_the_same_problems_are_left_out(tmp_path: Path) -> None:
    before = problem_rows(0, "greedy_accuracy", 1, [1, 0, 0, 1])
    before += problem_rows(0, "sampled_accuracy", 1, [0.5, 0.5, 0.25, 0.75])
    after = problem_rows(1, "greedy_accuracy", 1, [1, 1, 1, 0], ids="abcx")  # another problem
    after += problem_rows(1, "sampled_accuracy", 1, [0.75, 0.5, 0.25, 0.5])
    change = policy_change(write_policies(tmp_path, {0: before, 1: after}), "r")
    assert change is not None
    assert [m.label for m in change.metrics] == ["sampled"]
    assert change.metrics[0].mean == pytest.approx(0.0)


def test_nothing_to_compare_gives_none(tmp_path: Path) -> None:
    policy_0 = policy_rows(0, [1, 0, 0, 1], [0.5] * 4, [1] * 4)
    only_policy_0 = write_policies(tmp_path / "a", {0: policy_0})
    assert policy_change(only_policy_0, "r") is None
    no_rows = RunStore(tmp_path / "b")
    with no_rows.open_run("r", {}):
        pass
    assert policy_change(no_rows, "r") is None


def test_a_change_reads_in_standard_errors() -> None:
    assert MetricChange("greedy", -0.05, 0.09).text() == "greedy -0.050±0.090 (-0.6 s.e.)"
    assert MetricChange("greedy", 0.0, 0.0).text() == (
        "greedy +0.000 (the same change on every question)"
    )
