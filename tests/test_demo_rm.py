"""The demo's reward models at demo scale (seeded): the ORM that rewards GRPO ranks fresh
held-out outputs of the policy it is about to reward, and GRPO is paid by it, not by the
verifier. One iteration of the `demo` preset with a short GRPO stage and evaluation:
about 2 minutes on 2 cores (warm start, 4096 rollouts, labelling, RM training)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.config import load_config
from flows.loop import execute_run
from storage.store import RunStore

pytestmark = pytest.mark.slow

ORM_AUROC_BAR = 0.85


def test_demo_orm_ranks_fresh_outputs_and_is_the_grpo_reward(tmp_path: Path) -> None:
    cfg = load_config(
        "demo",
        [
            f"store.root={tmp_path}",
            "run.run_id=demo-rm",
            "run.iterations=1",
            "grpo.steps=2",
            "evaluation.n_prompts=20",
        ],
    )
    assert cfg.grpo.rewards.verifier == 0 and cfg.grpo.rewards.orm > 0
    execute_run(cfg)
    store = RunStore(tmp_path)
    drift = {
        r["metric"]: r["value"]
        for r in store.read("eval", run_id="demo-rm", where="policy_iteration = 0").to_pylist()
    }
    orm, prm = drift["orm_auroc"], drift["prm_step_auroc"]
    base = drift["prm_step_majority_baseline"]
    print(
        f"ORM AUROC {orm:.3f} (bar {ORM_AUROC_BAR}); PRM step AUROC {prm:.3f} (majority {base:.3f})"
    )
    assert drift["orm_auroc"] >= ORM_AUROC_BAR
    assert drift["prm_step_auroc"] > 0.5
    samples = store.read("policy_samples", run_id="demo-rm").to_pylist()
    # The reward is the ORM's probability alone: never the verifier's 0/1.
    assert all(s["reward"] == pytest.approx(s["reward_rm"]) for s in samples)
    assert len({round(s["reward"], 6) for s in samples}) > 2
