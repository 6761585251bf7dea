"""The tracking section, the flattened config, the global step and the metric keys, and one
committed stage read back as metric points from a real store."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flows.config_files import load_config
from flows.errors import ConfigError
from flows.tracking.backends import require_installed
from flows.tracking.config import TrackingSection
from flows.tracking.points import (
    MetricPoint,
    eval_metric_name,
    flatten_config,
    global_step,
    metric_key,
    stage_points,
    stage_policy_iteration,
)
from flows.tracking.run_tracking import tensorboard_dir
from grpo_core.contracts.errors import SettingError
from storage.store import RunStore


def test_flatten_config_dots_keys_and_writes_non_text_as_json() -> None:
    tree = {
        "run": {"seed": 3, "device": "cpu", "num_threads": None},
        "grpo": {"algo": {"lr": 1e-4, "clip": [0.2, 0.28]}, "on": True},
        "empty": {},
    }
    assert flatten_config(tree) == {
        "run.seed": "3",
        "run.device": "cpu",
        "run.num_threads": "null",
        "grpo.algo.lr": "0.0001",
        "grpo.algo.clip": "[0.2, 0.28]",
        "grpo.on": "true",
        "empty": "{}",
    }


_leaves = st.one_of(st.integers(), st.floats(allow_nan=False), st.text(max_size=5), st.none())
_trees = st.recursive(
    _leaves,
    lambda inner: st.dictionaries(st.from_regex(r"[a-z]{1,4}", fullmatch=True), inner, max_size=4),
    max_leaves=20,
)


def _leaf_count(tree: object) -> int:
    if isinstance(tree, dict):
        return sum(_leaf_count(v) for v in tree.values()) if tree else 1
    return 1


@given(st.dictionaries(st.from_regex(r"[a-z]{1,4}", fullmatch=True), _trees, max_size=4))
def test_flatten_config_keeps_one_text_value_per_leaf(tree: dict[str, object]) -> None:
    flat = flatten_config(tree)
    assert len(flat) == sum(_leaf_count(v) for v in tree.values())
    assert all(isinstance(v, str) for v in flat.values())


def test_global_step_counts_grpo_steps_over_the_run() -> None:
    assert global_step(0, 0, 3) == 0
    assert global_step(0, 2, 3) == 2
    assert global_step(1, 0, 3) == 3
    assert global_step(4, 1, 10) == 41
    with pytest.raises(ValueError, match=r"outside 0\.\.2"):
        global_step(1, 3, 3)


@given(st.integers(1, 50), st.integers(0, 20), st.integers(0, 49))
def test_global_step_rises_with_every_step_across_iterations(
    steps: int, iteration: int, step: int
) -> None:
    step %= steps
    here = global_step(iteration, step, steps)
    after = global_step(iteration + 1, 0, steps) if step == steps - 1 else None
    later = after if after is not None else global_step(iteration, step + 1, steps)
    assert later == here + 1


def test_metric_keys_are_what_mlflow_accepts() -> None:
    assert metric_key("eval", "test", eval_metric_name("pass@k", 4)) == "eval/test/pass_at_4"
    assert metric_key("grpo", "reward_mean") == "grpo/reward_mean"
    assert metric_key("train_rm", "orm loss(1)") == "train_rm/orm loss_1_"
    assert eval_metric_name("greedy_accuracy", 1) == "greedy_accuracy"
    assert eval_metric_name("maj@k", 8) == "maj@8"


def test_each_stage_reports_at_the_policy_it_measures() -> None:
    assert stage_policy_iteration("warm_start", 0) == 0
    assert stage_policy_iteration("train_rm", 2) == 2  # RM_2 ranks policy_2's outputs
    assert stage_policy_iteration("evaluate", 2) == 3  # the evaluation of iteration 2: policy_3


def test_tracking_section_reads_the_forms_text_and_defaults_off(tmp_path: Path) -> None:
    assert not TrackingSection().enabled
    on = load_config("micro", ["tracking.tensorboard=true", "tracking.mlflow.uri=file:./m"])
    assert on.tracking.tensorboard is True and on.tracking.mlflow.uri == "file:./m"
    assert on.tracking.mlflow.experiment == "itergrpo"
    assert TrackingSection.model_validate({"tensorboard": "false", "mlflow": {"uri": " "}}) == (
        TrackingSection()
    )
    run_dir = tmp_path / "runs" / "r"
    assert tensorboard_dir(on.tracking, run_dir) == run_dir / "tensorboard"
    assert tensorboard_dir(TrackingSection(tensorboard=str(tmp_path / "tb")), run_dir) == (
        tmp_path / "tb"
    )
    assert tensorboard_dir(TrackingSection(), run_dir) is None
    with pytest.raises(ConfigError, match=r"tracking\.mlflow\.experiment"):
        load_config("micro", ["tracking.mlflow.experiment="])


def test_a_tracker_not_installed_names_the_extra() -> None:
    with pytest.raises(SettingError, match=r"tracking\.mlflow\.uri .*itergrpo\[tracking\]"):
        require_installed("tracking.mlflow.uri", "itergrpo_no_such_module")


def test_stage_points_are_the_committed_rows_at_their_steps(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "store")
    with store.open_run("r", {"x": 1}) as run:
        with run.stage(1, "grpo") as attempt:
            attempt.write(
                "metrics",
                [
                    {"stage": "grpo", "step": s, "name": "reward_mean", "value": 0.1 * s}
                    for s in range(3)
                ],
            )
        with run.stage(1, "evaluate") as attempt:
            attempt.write(
                "eval",
                [
                    {"policy_iteration": 2, "split": "test", "metric": m, "k": k, "value": v}
                    | {"stderr": None, "n": 8}
                    for m, k, v in [("greedy_accuracy", 1, 0.5), ("pass@k", 4, 0.75)]
                ],
            )
        unfinished = run.stage(1, "rollout")  # written, never committed (a killed stage)
        unfinished.begin()
        unfinished.write("metrics", [{"stage": "rollout", "name": "accuracy", "value": 1.0}])
        with run.stage(2, "grpo") as attempt:
            attempt.write("metrics", [{"stage": "grpo", "step": 0, "name": "loss", "value": 2.0}])
    assert stage_points(store, "r", "grpo", 1, grpo_steps=3) == [
        MetricPoint("grpo/reward_mean", 0.0, 3),
        MetricPoint("grpo/reward_mean", 0.1, 4),
        MetricPoint("grpo/reward_mean", 0.2, 5),
    ]
    assert stage_points(store, "r", "evaluate", 1, grpo_steps=3) == [
        MetricPoint("eval/test/greedy_accuracy", 0.5, 2),
        MetricPoint("eval/test/pass_at_4", 0.75, 2),
    ]
    assert stage_points(store, "r", "grpo", 2, grpo_steps=3) == [MetricPoint("grpo/loss", 2.0, 6)]
    assert stage_points(store, "r", "rollout", 1, grpo_steps=3) == []
