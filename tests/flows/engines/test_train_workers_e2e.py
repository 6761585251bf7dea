"""The micro run with its GRPO updates on two long-lived Ray training ranks (gloo, CPU):
the single-process run's metrics and weights within tolerance, the same two rank processes
for every step of a stage, and a run killed with SIGKILL mid-stage resumes exactly (its
ranks die with it). Each run starts and stops its own local Ray on 127.0.0.1.

Tolerances are those of tests/flows/engines/test_engines_flow.py (one DeepSpeed process vs
torch over the micro run: gaps <= 3e-6; two launched ranks likewise): |gap| <= 1e-5 +
1e-4 |value| per GRPO metric, 1e-5 per weight, and the sampled rows identical.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
from torch import Tensor

from flows.engines import train_workers
from flows.loop import execute_run
from flows.names import GRPO_PROGRESS, POLICY
from grpo_core.contracts.policy_batch import PolicyBatch
from storage.checkpoints import EXTRA_FILE, checkpoint_path
from storage.store import RunStore
from tests.flow_helpers import cli, killed_micro_run, micro_config, snapshot
from tests.flows.engines.conftest import RAY_RUN_ID, RM_ON_RANKS, ray_sets
from tests.flows.engines.test_engines_flow import (
    WEIGHT_TOL,
    assert_close_metrics,
    grpo_metrics,
    max_weight_gap,
)

RAY_SETS = ray_sets()
TRAIN = RAY_SETS[1].split("=")[1]

pytestmark = [
    pytest.mark.skipif(find_spec("ray") is None, reason="ray is not installed"),
    pytest.mark.slow,
]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _still_alive(pids: list[int], seconds: float) -> list[int]:
    """The processes of `pids` still running after waiting up to `seconds` for them to exit
    (ray.kill only asks: an actor's process exits a moment later)."""
    deadline = time.monotonic() + seconds
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [p for p in pids if _alive(p)]


def started_rank_pids(stderr: str) -> list[int]:
    """The training ranks' pids, from the line a run logs when it starts them."""
    started = re.search(r"training ranks: 2 Ray actors \(pids \[(\d+), (\d+)\]\) on", stderr)
    assert started is not None, stderr[-2000:]
    return [int(p) for p in started.groups()]


def test_micro_run_on_two_ray_ranks_matches_one_process(
    micro_run: tuple[RunStore, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rank_pids: list[list[int]] = []  # per GRPO step, the processes that updated
    update = train_workers.RayWorkersUpdater.update

    def spy(
        self: Any, batch: PolicyBatch, adv: Tensor, old: Tensor | None, seed: int
    ) -> dict[str, float]:
        metrics = update(self, batch, adv, old, seed)
        rank_pids.append(self.ray.get([rank.pid.remote() for rank in self.ranks]))
        return metrics

    monkeypatch.setattr(train_workers.RayWorkersUpdater, "update", spy)
    # One process: the session's micro run (same preset and seed); this run takes its run id.
    reference, run_id = micro_run
    one, two = reference.root, tmp_path / "ray"
    cfg = micro_config(two, run_id, *RAY_SETS)
    execute_run(cfg)
    steps = cfg.grpo.steps
    assert len(rank_pids) == cfg.run.iterations * steps
    # No process started per step or per stage (engines.workers.lifetime auto: the run's):
    # the same two for every step of every GRPO stage, stopped at the run's end.
    assert len(set(rank_pids[0])) == 2 and os.getpid() not in rank_pids[0]
    assert all(pids == rank_pids[0] for pids in rank_pids)
    assert not _still_alive(rank_pids[0], 30)
    gap = assert_close_metrics(grpo_metrics(one, run_id), grpo_metrics(two, run_id))
    weights = max(
        max_weight_gap(
            checkpoint_path(one, run_id, POLICY, k), checkpoint_path(two, run_id, POLICY, k)
        )
        for k in (1, 2)
    )
    print(f"2 Ray ranks ({TRAIN}) vs one process: metrics |gap| {gap:.2e}, weights {weights:.2e}")
    assert weights <= WEIGHT_TOL
    want, got = snapshot(reference, run_id), snapshot(RunStore(two), run_id)
    for table in ("prompts", "rollouts", "orm_labels", "rm_train"):
        assert got[table] == want[table], table


def test_a_stage_that_samples_without_its_model_leaves_the_weights_to_the_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RFT samples policy_0, not the policy being trained: with Ray ranks the GRPO stage loads
    policy_k as a skeleton, and what it saves (progress, policy_1) is rank 0's weights, the
    single-process run's within the tolerances above."""
    holds: list[bool] = []
    update = train_workers.RayWorkersUpdater.update

    def spy(
        self: Any, batch: PolicyBatch, adv: Tensor, old: Tensor | None, seed: int
    ) -> dict[str, float]:
        holds.append(self.stage_holds_weights)
        return update(self, batch, adv, old, seed)

    monkeypatch.setattr(train_workers.RayWorkersUpdater, "update", spy)
    sets = ("run.iterations=1", "grpo.preset=rft")
    one, ranks = tmp_path / "one", tmp_path / "ranks"
    execute_run(micro_config(one, "rft", *sets))
    cfg = micro_config(ranks, "rft", *sets, *RAY_SETS)
    execute_run(cfg)
    assert holds == [False] * cfg.grpo.steps
    gap = assert_close_metrics(grpo_metrics(one, "rft"), grpo_metrics(ranks, "rft"))
    final = (checkpoint_path(one, "rft", POLICY, 1), checkpoint_path(ranks, "rft", POLICY, 1))
    weights = max_weight_gap(*final)
    moved = max_weight_gap(checkpoint_path(ranks, "rft", POLICY, 0), final[1])
    print(f"RFT, 2 Ray ranks, no weights in the stage: |gap| {gap:.2e}, weights {weights:.2e}")
    assert weights <= WEIGHT_TOL and moved > 10 * WEIGHT_TOL, moved  # trained: not policy_0
    assert (
        snapshot(RunStore(ranks), "rft")["policy_samples"]
        == snapshot(RunStore(one), "rft")["policy_samples"]
    )


def test_reward_models_trained_on_the_ranks_match_the_stage_process(
    ray_ranks_reference: Path, rm_ranks_reference: Path
) -> None:
    """engines.workers.reward_models: the micro run's ORM_0 and PRM_0 train on the two ranks
    that then run its GRPO updates; the same rm_train rows as the reference run (RMs in the
    stage process), and their weights and training losses within the tolerances above."""
    rr, store = RAY_RUN_ID, rm_ranks_reference
    want, got = snapshot(RunStore(ray_ranks_reference), rr), snapshot(RunStore(store), rr)
    assert got["rm_train"] == want["rm_train"] and got["orm_labels"] == want["orm_labels"]
    gaps = [
        max_weight_gap(
            checkpoint_path(ray_ranks_reference, rr, kind, 0), checkpoint_path(store, rr, kind, 0)
        )
        for kind in ("orm", "prm")
    ]
    assert max(gaps) <= WEIGHT_TOL, gaps
    # the starting model written for the ranks is gone with its directory
    assert not list((store / "checkpoints" / rr).glob("*ranks-start*"))
    rm_metrics = [
        {
            r["name"]: r["value"]
            for r in RunStore(root).read("metrics", run_id=rr).to_pylist()
            if r["stage"] == "train_rm"
        }
        for root in (ray_ranks_reference, store)
    ]
    for name in ("orm_loss_first_epoch", "orm_loss_last_epoch", "prm_loss_last_epoch"):
        assert rm_metrics[1][name] == pytest.approx(rm_metrics[0][name], rel=1e-4), name
    print(f"RMs on 2 Ray ranks vs the stage process: weight gaps {gaps[0]:.2e} / {gaps[1]:.2e}")


def test_ranks_killed_while_reward_models_train_and_mid_grpo_resume_exactly(
    rm_ranks_reference: Path, tmp_path: Path
) -> None:
    """One run killed twice (SIGKILL), its ranks dying with it each time: after ORM_0 trained
    on the ranks, before PRM_0 (the stage's second progress report), then, resumed, in the
    GRPO stage after step 1's update (step 0 saved only). The half-written train_rm stage is
    redone on new ranks, GRPO resumes at step 1 from the optimizer state rank 0 wrote, and
    the run ends with the uninterrupted run's rows, metrics and weights exactly. (One run
    for both kills: each kill needs a run of its own up to it, Ray and two ranks started.)"""
    sets = ["run.iterations=1", *RAY_SETS, RM_ON_RANKS]
    reference, rr, store = rm_ranks_reference, RAY_RUN_ID, tmp_path / "killed"
    killed = killed_micro_run(store, rr, sets, fault="SIGKILL@train_rm:0:2")
    assert "ORM trained on 2 Ray ranks" in killed.stderr, killed.stderr[-2000:]
    assert "PRM trained on 2 Ray ranks" not in killed.stderr
    assert not _still_alive(started_rank_pids(killed.stderr), 60)
    mid_grpo = cli(store, "resume", rr, fault="SIGKILL@grpo:0:2")
    assert mid_grpo.returncode == -signal.SIGKILL, mid_grpo.stderr[-2000:]
    assert "PRM trained on 2 Ray ranks" in mid_grpo.stderr  # the stage redone on new ranks
    assert not _still_alive(started_rank_pids(mid_grpo.stderr), 60)
    progress = checkpoint_path(store, rr, GRPO_PROGRESS, 0)
    assert json.loads((progress / EXTRA_FILE).read_text())["next_step"] == 1
    resumed = cli(store, "resume", rr)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "GRPO: resuming at step 1" in resumed.stderr
    assert snapshot(RunStore(store), rr) == snapshot(RunStore(reference), rr)
    assert grpo_metrics(store, rr) == grpo_metrics(reference, rr)
    for role, k in (("orm", 0), ("prm", 0), (POLICY, 1)):
        final = (checkpoint_path(reference, rr, role, k), checkpoint_path(store, rr, role, k))
        assert max_weight_gap(*final) == 0.0, role
