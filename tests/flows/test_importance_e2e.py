"""GSPO and the rollout correction end to end on `micro`: each runs a GRPO stage, and what it
reports per step reaches the stored `metrics` table."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.loop import execute_run
from storage.store import RunStore
from tests.flow_helpers import micro_config

SHORT = ("run.iterations=1", "grpo.steps=2")


def grpo_step_metrics(store: Path, run_id: str) -> dict[int, dict[str, float]]:
    """Each GRPO step's stored metrics, by name."""
    by_step: dict[int, dict[str, float]] = {}
    for m in RunStore(store).read("metrics", run_id=run_id).to_pylist():
        if m["stage"] == "grpo" and m["step"] is not None:
            by_step.setdefault(m["step"], {})[m["name"]] = m["value"]
    return by_step


def test_gspo_runs_micro_and_clips_with_its_sequence_range(tmp_path: Path) -> None:
    # two inner epochs: the second sees pi_theta != pi_old, where the level matters
    settings = (*SHORT, "grpo.algo.importance_sampling=sequence", "grpo.algo.mu=2")
    cfg = micro_config(tmp_path, "gspo", *settings)
    assert cfg.grpo.algo.clip_range == (3e-4, 4e-4)
    execute_run(cfg)
    steps = grpo_step_metrics(tmp_path, "gspo")
    assert sorted(steps) == [0, 1]
    for values in steps.values():
        assert values["optimizer_steps"] == 2
        # the whole output's ratio moved past GSPO's 3e-4 / 4e-4 range on some tokens
        assert values["clip_frac_low"] + values["clip_frac_high"] > 0
        assert not any(name.startswith("rollout_weight") for name in values)  # correction off


def test_the_rollout_correction_stores_its_weights_per_step(tmp_path: Path) -> None:
    settings = (*SHORT, "grpo.algo.rollout_correction.mode=tis")
    execute_run(micro_config(tmp_path, "tis", *settings))
    steps = grpo_step_metrics(tmp_path, "tis")
    assert sorted(steps) == [0, 1]
    for values in steps.values():
        # the sampler and the trainer are the same fp32 model on CPU: weights ~1, none cut
        assert values["rollout_weight_mean"] == pytest.approx(1.0, abs=1e-3)
        assert values["rollout_weight_truncated_frac"] == 0.0
        assert values["rollout_weight_raw_max"] == pytest.approx(1.0, abs=1e-4)
        assert values["rollout_weight_raw_min"] == pytest.approx(1.0, abs=1e-4)
        assert values["sampling_logprob_gap_max"] < 1e-4  # the gap the weights correct for
        assert "rollout_weight_masked_frac" not in values
