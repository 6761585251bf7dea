"""`grpo.preset=ppo` end to end on `micro` (one iteration): the critic is stored, its metrics
are, and a kill -9 mid-GRPO resumes to the uninterrupted run exactly, the critic's weights,
optimizer moments and adaptive KL coefficient included (CPU, one thread: deterministic), on
the torch engine and on DeepSpeed ZeRO-3 (policy and critic; the critic's optimizer then
resumes from DeepSpeed's own checkpoint)."""

from __future__ import annotations

import signal
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from flows.loop import execute_run
from flows.names import CRITIC, GRPO_PROGRESS, POLICY
from flows.report import iteration_table
from grpo_core.engines.cost import (
    MEASURED_METRICS,
    MIB,
    PEAK_MEMORY_MIB,
    STEP_SECONDS,
    TRAINING_STATE_MIB,
    adamw_training_state_bytes,
)
from grpo_core.model.critic import CRITIC_FILE, ValueModel
from grpo_core.model.policy import load_policy
from storage.checkpoints import checkpoint_path
from storage.store import RunStore
from tests.flow_helpers import cli, micro_config, snapshot

pytestmark = pytest.mark.slow
RUN_ID = "ppo"
# mu = 2 epochs of 2 mini-batches and a critic lr that moves it: a resume that lost the
# critic's optimizer state, its weights or the KL coefficient would give other numbers.
PPO = (
    "run.iterations=1",
    "grpo.preset=ppo",
    "grpo.algo.mu=2",
    "grpo.algo.mini_batches_per_epoch=2",
    "grpo.algo.ppo.critic_lr=1e-3",
    "grpo.algo.ppo.kl_ctl=adaptive",
    "grpo.algo.ppo.target_kl=0.001",
    "grpo.algo.ppo.horizon=16",
)


def grpo_metrics(store: Path) -> dict[tuple[int, str], float]:
    rows = RunStore(store).read("metrics", run_id=RUN_ID).to_pylist()
    return {
        (r["step"], r["name"]): r["value"]
        for r in rows
        if r["stage"] == "grpo" and r["name"] not in MEASURED_METRICS  # time, memory differ
    }


def assert_cost_recorded(store: Path) -> None:
    """Each step's wall time, the stage's peak memory, and the training state of policy and
    critic (weights, gradients, AdamW moments) counted from the stored models."""
    rows = RunStore(store).read("metrics", run_id=RUN_ID, stage="grpo").to_pylist()
    cost = {(r["step"], r["name"]): r["value"] for r in rows if r["iteration"] == 0}
    assert all(cost[(step, STEP_SECONDS)] > 0 for step in range(3))
    assert cost[(None, PEAK_MEMORY_MIB)] >= 0
    policy = load_policy(checkpoint_path(store, RUN_ID, POLICY, 1))[0]
    critic = ValueModel.load(checkpoint_path(store, RUN_ID, CRITIC, 1))
    held = adamw_training_state_bytes(policy) + adamw_training_state_bytes(critic)
    assert cost[(None, TRAINING_STATE_MIB)] == pytest.approx(held / MIB, rel=1e-12)


def critic_weights(store: Path) -> dict[str, Any]:
    path = checkpoint_path(store, RUN_ID, CRITIC, 1)
    assert (path / CRITIC_FILE).is_file()
    return {k: v.tolist() for k, v in load_file(str(path / "model.safetensors")).items()}


@pytest.mark.parametrize(
    "engine",
    [
        pytest.param((), id="torch"),
        pytest.param(
            ("engines.train=deepspeed", "engines.deepspeed.zero_stage=3"),
            id="deepspeed-zero3",
            marks=pytest.mark.skipif(find_spec("deepspeed") is None, reason="no deepspeed"),
        ),
    ],
)
def test_ppo_runs_micro_stores_the_critic_and_resumes_a_kill_exactly(
    tmp_path: Path, engine: tuple[str, ...]
) -> None:
    sets = (*PPO, *engine)
    reference = tmp_path / "reference"
    execute_run(micro_config(reference, RUN_ID, *sets))
    metrics = grpo_metrics(reference)
    for name in ("value_loss", "explained_variance", "value_mean", "returns_mean", "kl_coef"):
        assert all((step, name) in metrics for step in range(3)), name
    assert metrics[(0, "kl_coef")] == 0.04  # the start value, then the controller moves it
    # The KL it applies, a penalty in the reward, is its `kl` (the loss's 0 stood there
    # before): 0 at step 0, where policy_0 is its own reference, then the policy's drift.
    kls = [metrics[(step, "kl")] for step in range(3)]
    assert abs(kls[0]) < 1e-6 and kls[1] != 0.0 and kls[2] != 0.0
    (_, trained) = iteration_table(RunStore(reference), RUN_ID)
    assert trained["kl"] == pytest.approx(sum(kls) / 3)
    assert_cost_recorded(reference)
    assert metrics[(2, "kl_coef")] != metrics[(0, "kl_coef")]

    store = tmp_path / "killed"
    args = ("--config", "micro", "--run-id", RUN_ID, *(f"--set={o}" for o in sets))
    killed = cli(store, "run", *args, fault="SIGKILL@grpo:0:2")  # step 0 saved, step 1 not
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    progress = checkpoint_path(store, RUN_ID, GRPO_PROGRESS, 0)
    assert (progress / "critic" / CRITIC_FILE).is_file()
    assert (progress / "critic" / "engine").is_dir() == bool(engine)  # DeepSpeed's own
    resumed = cli(store, "resume", RUN_ID)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "GRPO: resuming at step 1" in resumed.stderr

    assert grpo_metrics(store) == metrics
    assert critic_weights(store) == critic_weights(reference)
    assert snapshot(RunStore(store), RUN_ID) == snapshot(RunStore(reference), RUN_ID)
