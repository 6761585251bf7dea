"""The micro run's GRPO updates on a long-lived Ray training rank that holds the GPU
(`make gpu-check`): DeepSpeed ZeRO-2 on NCCL, in fp32 against the same engine in the stage's
own process, then in bf16; and its reward models trained on that rank.

fp32: the rank runs the in-process engine's code on the same GPU, inputs and seeds, so the
tolerances are tests/flows/engines/test_engines_flow.py's (1e-5 + 1e-4 |value| per GRPO metric,
1e-5 per weight) and the sampled rows are identical. bf16: the stage's sampling copy stays in
the run's fp32 and gets the rank's weights after each update, so the first GRPO step samples
what the fp32 runs sampled and its gradient norm is held to theirs within 5% (bf16 rounds
activations to 8 mantissa bits; the same run on CPU lands within 0.2%); later steps sample
other tokens.
"""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from flows.engines import train_workers
from flows.loop import execute_run, planned_stages
from flows.names import POLICY
from grpo_core.contracts.policy_batch import PolicyBatch
from storage.checkpoints import checkpoint_path
from storage.store import RunStore
from tests.flow_helpers import micro_config, snapshot
from tests.flows.engines.test_engines_flow import (
    WEIGHT_TOL,
    assert_close_metrics,
    grpo_metrics,
    max_weight_gap,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(find_spec("ray") is None, reason="ray is not installed"),
    pytest.mark.skipif(find_spec("deepspeed") is None, reason="deepspeed is not installed"),
]

GPU_RUN = ("run.device=cuda", "run.iterations=1", "engines.train=deepspeed")
ON_A_GPU_RANK = (
    "engines.train_workers=ray",
    "engines.workers.ranks=1",
    "engines.workers.num_gpus_per_rank=1",
    "engines.workers.start_timeout_s=120",  # a Ray that sees no GPU fails fast
)
BF16_REL_TOL = 5e-2


def _spy_on_ranks(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str, str]]:
    """Per GRPO step: the rank's pid, its engine's device and its policy's dtype."""
    seen: list[tuple[int, str, str]] = []
    update = train_workers.RayWorkersUpdater.update

    def spy(
        self: Any, batch: PolicyBatch, adv: Tensor, old: Tensor | None, seed: int
    ) -> dict[str, float]:
        metrics = update(self, batch, adv, old, seed)

        def where(rank: Any) -> tuple[int, str, str]:
            dtype = next(rank.model.parameters()).dtype  # DeepSpeed casts it in place
            return os.getpid(), str(rank.engine.device), str(dtype)

        seen.append(self.ray.get(self.ranks[0].__ray_call__.remote(where)))
        return metrics

    monkeypatch.setattr(train_workers.RayWorkersUpdater, "update", spy)
    return seen


def test_micro_run_on_a_gpu_ray_rank_matches_the_in_process_engine_then_runs_bf16(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = "gpu"
    in_process, fp32_rank, bf16_rank = tmp_path / "one", tmp_path / "fp32", tmp_path / "bf16"
    cfg = micro_config(in_process, run_id, *GPU_RUN)
    execute_run(cfg)
    seen = _spy_on_ranks(monkeypatch)
    results = execute_run(micro_config(fp32_rank, run_id, *GPU_RUN, *ON_A_GPU_RANK))
    assert [(r.stage, r.iteration) for r in results] == planned_stages(cfg)
    steps = cfg.grpo.steps
    assert len(seen) == steps and len({pid for pid, _, _ in seen}) == 1  # one process throughout
    assert seen[0][0] != os.getpid() and seen[0][1:] == ("cuda:0", "torch.float32")

    gap = assert_close_metrics(grpo_metrics(in_process, run_id), grpo_metrics(fp32_rank, run_id))
    weights = max_weight_gap(
        checkpoint_path(in_process, run_id, POLICY, 1),
        checkpoint_path(fp32_rank, run_id, POLICY, 1),
    )
    print(
        f"GPU Ray rank vs in-process DeepSpeed (fp32): metrics |gap| {gap:.2e}, "
        f"weights {weights:.2e}"
    )
    assert weights <= WEIGHT_TOL
    want, got = snapshot(RunStore(in_process), run_id), snapshot(RunStore(fp32_rank), run_id)
    for table in ("prompts", "rollouts", "policy_samples", "orm_labels"):
        assert got[table] == want[table], table

    seen.clear()
    bf16 = micro_config(bf16_rank, run_id, *GPU_RUN, *ON_A_GPU_RANK, "engines.deepspeed.bf16=true")
    results = execute_run(bf16)
    assert [(r.stage, r.iteration) for r in results] == planned_stages(bf16)
    assert len(seen) == steps and {s[1:] for s in seen} == {("cuda:0", "torch.bfloat16")}
    fp32_metrics, bf16_metrics = grpo_metrics(fp32_rank, run_id), grpo_metrics(bf16_rank, run_id)
    assert all(torch.isfinite(torch.tensor(v)) for v in bf16_metrics.values())
    first = (0, 0, "grad_norm")  # iteration 0 trains policy_1
    print(
        f"bf16 rank: first-step grad norm {bf16_metrics[first]:.4f}, fp32 {fp32_metrics[first]:.4f}"
    )
    assert bf16_metrics[first] == pytest.approx(fp32_metrics[first], rel=BF16_REL_TOL)
    moved = max_weight_gap(
        checkpoint_path(bf16_rank, run_id, POLICY, 0), checkpoint_path(bf16_rank, run_id, POLICY, 1)
    )
    assert moved > 1e-4  # bf16 updates moved the stored policy


def test_reward_models_on_a_gpu_rank_match_the_stage_process(tmp_path: Path) -> None:
    """engines.workers.reward_models on the GPU rank: ORM_0 and PRM_0 trained there (one
    rank, DeepSpeed fp32) as the stage process trains them on the same GPU, the policy's
    updates on the rank in both runs; fp32 tolerances as above."""
    run_id = "gpu-rm"
    in_stage, on_rank = tmp_path / "stage", tmp_path / "rank"
    execute_run(micro_config(in_stage, run_id, *GPU_RUN, *ON_A_GPU_RANK))
    on_ranks = (*GPU_RUN, *ON_A_GPU_RANK, "engines.workers.reward_models=true")
    execute_run(micro_config(on_rank, run_id, *on_ranks))
    want, got = snapshot(RunStore(in_stage), run_id), snapshot(RunStore(on_rank), run_id)
    assert got["rm_train"] == want["rm_train"]
    gaps = [
        max_weight_gap(
            checkpoint_path(in_stage, run_id, kind, 0), checkpoint_path(on_rank, run_id, kind, 0)
        )
        for kind in ("orm", "prm")
    ]
    print(f"RMs on a GPU Ray rank vs the stage process: weight gaps {gaps[0]:.2e} / {gaps[1]:.2e}")
    assert max(gaps) <= WEIGHT_TOL
