"""Process supervision end to end: the PRM's step scores are GRPO's reward, stored and
reported; and the retrain switch keeps the iteration-0 reward models (micro scale)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.config_files import load_config
from flows.loop import execute_run, planned_stages
from storage.sql import run_query
from storage.store import RunStore
from tests.flow_helpers import micro_config

pytestmark = pytest.mark.slow


def rows(root: Path, query: str) -> list[dict]:
    return run_query(RunStore(root), query).to_pylist()


def test_demo_ps_preset_is_process_supervised_by_the_prm_alone() -> None:
    cfg = load_config("demo-ps")
    assert cfg.grpo.algo.adv_estimator == "grpo_process" and cfg.grpo.algo.process_supervision
    assert cfg.grpo.rewards.verifier == 0 and cfg.reward_models.use_prm


def test_process_supervised_run_rewards_steps_with_the_prm(tmp_path: Path) -> None:
    cfg = micro_config(
        tmp_path,
        "ps",
        "grpo.algo.adv_estimator=grpo_process",
        "grpo.rewards.verifier=0",
        "grpo.rewards.orm=0",
    )
    results = execute_run(cfg)
    assert [(r.stage, r.iteration) for r in results] == planned_stages(cfg)
    # The reward each output received is its mean PRM step score (outcome weights are 0).
    samples = rows(
        tmp_path,
        "SELECT reward, reward_rm, advantage FROM policy_samples WHERE run_id = 'ps'",
    )
    assert len(samples) == cfg.run.iterations * cfg.grpo.steps * 4 * 4
    assert all(s["reward"] == pytest.approx(s["reward_rm"]) for s in samples)
    assert all(0.0 <= s["reward_rm"] <= 1.0 for s in samples)
    assert any(abs(s["advantage"]) > 1e-3 for s in samples)  # step rewards moved the policy
    metrics = rows(
        tmp_path,
        "SELECT name, count(*) AS n, min(value) AS lo FROM metrics WHERE run_id = 'ps' "
        "AND stage = 'grpo' AND name IN ('reward_mean', 'rm_reward_mean', 'verifier_accuracy') "
        "GROUP BY name ORDER BY name",
    )
    steps = cfg.run.iterations * cfg.grpo.steps
    assert [(m["name"], m["n"]) for m in metrics] == [
        ("reward_mean", steps),
        ("rm_reward_mean", steps),
        ("verifier_accuracy", steps),
    ]
    assert metrics[0]["lo"] > 0  # reward_mean includes the PRM (it was 0.000 before)


def test_retrain_false_keeps_the_iteration_0_reward_models(tmp_path: Path) -> None:
    cfg = micro_config(tmp_path, "frozen", "reward_models.retrain=false")
    execute_run(cfg)
    store = RunStore(tmp_path)
    root = tmp_path / "checkpoints" / "frozen"
    for kind in ("orm", "prm"):
        first = (root / kind / "iter-0" / "model.safetensors").read_bytes()
        assert (root / kind / "iter-1" / "model.safetensors").read_bytes() == first
    trained = rows(tmp_path, "SELECT DISTINCT iteration FROM rm_train WHERE run_id = 'frozen'")
    assert trained == [{"iteration": 0}]  # nothing is trained after iteration 0
    # Drift is still measured: RM_1 (= RM_0) and RM_0 score the same outputs identically.
    drift = {
        r["metric"]: r["value"]
        for r in store.read(
            "eval", run_id="frozen", where="policy_iteration = 1 AND split = 'train'"
        ).to_pylist()
    }
    assert drift["orm_auroc"] == drift["orm_auroc_stale"]
    assert drift["prm_step_auroc"] == drift["prm_step_auroc_stale"]
