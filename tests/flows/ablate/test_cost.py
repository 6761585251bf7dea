"""The cost beside the accuracy: a GRPO stage's metrics rows -> its cost figures, and the
"cost per arm" table from hand-made `ablation` rows (means over seeds)."""

from __future__ import annotations

from typing import Any

import pytest

from flows.ablate.cost import (
    PEAK_MIB,
    S_PER_STEP,
    STATE_MIB,
    cost_table,
    format_cost_table,
    stage_costs,
)
from flows.ablate.results import Values, results_table


def _metric(iteration: int, step: int | None, name: str, value: float) -> dict[str, Any]:
    return {"iteration": iteration, "step": step, "name": name, "value": value}


def test_stage_costs_take_the_median_step_and_the_stage_figures() -> None:
    rows = [
        *(_metric(0, s, "step_seconds", v) for s, v in enumerate([3.0, 1.0, 2.0, 10.0])),
        _metric(0, 1, "kl", 0.5),  # not a cost
        _metric(0, None, "peak_memory_mib", 100.0),
        _metric(0, None, "training_state_mib", 12.5),
        _metric(1, 0, "step_seconds", 4.0),
    ]
    # iteration 0 trained policy_1: median of 1, 2, 3, 10 = (2 + 3) / 2 = 2.5
    assert stage_costs(rows) == {
        1: {S_PER_STEP: 2.5, PEAK_MIB: 100.0, STATE_MIB: 12.5},
        2: {S_PER_STEP: 4.0},
    }


def _rows(arm: str, policy: int, metric: str, per_seed: list[float]) -> list[dict[str, Any]]:
    k = 64 if metric == "maj@k" else None
    return [
        {"arm": arm, "seed": s, "policy_iteration": policy, "metric": metric, "k": k, "value": v}
        for s, v in enumerate(per_seed)
    ]


def test_cost_table_means_over_seeds_and_leaves_policy_0_out() -> None:
    rows = [
        *_rows("grpo_os", 0, "greedy_accuracy", [0.5, 0.7]),
        *_rows("grpo_os", 1, "greedy_accuracy", [0.6, 0.8]),
        *_rows("grpo_os", 1, S_PER_STEP, [2.0, 3.0]),  # mean 2.5
        *_rows("grpo_os", 1, PEAK_MIB, [100.0, 200.0]),  # mean 150
        *_rows("grpo_os", 1, STATE_MIB, [10.2, 10.2]),
        *_rows("ppo", 0, "greedy_accuracy", [0.5, 0.7]),
        *_rows("ppo", 1, "greedy_accuracy", [0.7, 0.7]),
        *_rows("ppo", 1, S_PER_STEP, [4.0, 5.5]),  # mean 4.75
        *_rows("ppo", 1, STATE_MIB, [20.5, 20.5]),  # no peak recorded
    ]
    values = Values.from_rows(rows)
    table = cost_table(values)
    assert [(r["arm"], r["policy"], r["seeds"]) for r in table] == [
        ("grpo_os", 1, 2),
        ("ppo", 1, 2),
    ]
    assert table[0][S_PER_STEP] == pytest.approx(2.5)
    assert table[0][PEAK_MIB] == pytest.approx(150.0)
    assert table[1][PEAK_MIB] is None
    lines = [" ".join(line.split()) for line in format_cost_table(values).splitlines()]
    assert lines[0] == "arm policy seeds s/step peak MiB state MiB"
    assert lines[2:] == ["grpo_os 1 2 2.50 150 10.2", "ppo 1 2 4.75 - 20.5"]
    # the results table keeps its rows: policy_0 then each trained policy, no cost in them
    assert [(r["arm"], r["policy"]) for r in results_table(values)] == [
        ("policy_0", 0),
        ("grpo_os", 1),
        ("ppo", 1),
    ]


def test_an_ablation_without_cost_rows_prints_no_cost_table() -> None:
    values = Values.from_rows(_rows("grpo_os", 1, "greedy_accuracy", [0.6]))
    assert cost_table(values) == []
    assert format_cost_table(values) == ""
