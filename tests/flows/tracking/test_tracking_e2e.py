"""`micro` with MLflow (a real `mlflow server` on loopback, sqlite backend) and TensorBoard on,
killed with SIGKILL in the middle of a GRPO stage and resumed: one MLflow run holds the
config, every stored metric once per step with its stored value, and the report; the
TensorBoard event files read back the same."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from flows.cli.main import main as itergrpo
from flows.tracking.points import flatten_config, stage_points
from flows.tracking.record import mlflow_run
from storage.store import RunStore
from tests.flow_helpers import REPO, cli

RUN_ID = "tracked"


def _stored_points(store: RunStore, steps: int) -> dict[tuple[str, int], float]:
    """Every metric point the committed stages hold, as the trackers must show them."""
    points: dict[tuple[str, int], float] = {}
    for row in store.committed_stages(RUN_ID):
        for p in stage_points(store, RUN_ID, row["stage"], row["iteration"], steps):
            assert (p.key, p.step) not in points, f"two stored values of {p.key} at {p.step}"
            points[p.key, p.step] = p.value
    return points


@pytest.mark.slow
def test_killed_and_resumed_run_logs_each_value_once_to_mlflow_and_tensorboard(
    tmp_path: Path, mlflow_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store_dir = tmp_path / "store"
    tracking = [
        "--set",
        f"tracking.mlflow.uri={mlflow_server}",
        "--set",
        "tracking.tensorboard=true",
    ]
    args = ("run", "--config", "micro", "--run-id", RUN_ID, *tracking)
    killed = cli(store_dir, *args, fault="SIGKILL@grpo:1:2")  # GRPO step 0 of iteration 1 done
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    store = RunStore(store_dir)
    tracked = mlflow_run(store.run_dir(RUN_ID))
    assert tracked is not None
    mlflow_run_id = tracked[0]
    client = MlflowClient(mlflow_server)
    assert client.get_run(mlflow_run_id).info.status == "RUNNING"
    sent_before_kill = client.get_metric_history(mlflow_run_id, "grpo/reward_mean")
    assert sorted(m.step for m in sent_before_kill) == [0, 1, 2]  # iteration 0 only

    resumed = cli(store_dir, "resume", RUN_ID)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert mlflow_run(store.run_dir(RUN_ID)) == tracked  # the same MLflow run continued
    experiment = client.get_experiment_by_name("itergrpo")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.run_id for r in runs] == [mlflow_run_id]
    run = client.get_run(mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert (
        tracked[1]
        == f"{mlflow_server}/#/experiments/{experiment.experiment_id}/runs/{mlflow_run_id}"
    )

    # The config as params, and the run's identity as tags.
    assert run.data.params == flatten_config(store.run_config(RUN_ID))
    assert run.data.params["tracking.mlflow.uri"] == mlflow_server
    tags = run.data.tags
    assert tags["itergrpo.run_id"] == RUN_ID
    assert tags["itergrpo.store"] == str(store_dir.resolve())
    assert tags["itergrpo.seed"] == "0"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if head.returncode == 0:  # a git checkout (CI, development): the commit that ran
        assert tags["itergrpo.git_commit"] == head.stdout.strip()

    # Every stored value once, at its step, with its stored value; nothing else but durations.
    cfg_steps = int(run.data.params["grpo.steps"])
    stored = _stored_points(store, cfg_steps)
    logged: dict[tuple[str, int], float] = {}
    for key in run.data.metrics:
        for m in client.get_metric_history(mlflow_run_id, key):
            assert (key, m.step) not in logged, f"{key} logged twice at step {m.step}"
            logged[key, m.step] = m.value
    durations = {k: v for k, v in logged.items() if k[0].startswith("duration_s/")}
    assert {k: v for k, v in logged.items() if k not in durations} == pytest.approx(stored)
    assert {(k, s) for k, s in stored if k.startswith("grpo/")} >= {
        ("grpo/reward_mean", s) for s in range(2 * cfg_steps)
    }  # the global step keeps rising over both iterations
    assert ("eval/test/pass_at_4", 2) in stored and ("eval/test/orm_auroc_stale", 1) in stored
    assert ("duration_s/grpo", 1) in durations and all(v > 0 for v in durations.values())

    # The report's plots and summary as artifacts.
    report = {a.path for a in client.list_artifacts(mlflow_run_id, "report")}
    assert "report/summary.md" in report and any(p.endswith(".png") for p in report)
    summary = client.download_artifacts(mlflow_run_id, "report/summary.md", str(tmp_path))
    assert Path(summary).read_text() == (store_dir / "reports" / RUN_ID / "summary.md").read_text()

    # TensorBoard: the same scalars, once per step, across the killed and the resumed writer.
    log_dir = store.run_dir(RUN_ID) / "tensorboard"
    assert len(list(log_dir.glob("events.out.tfevents.*"))) == 2
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    board: dict[tuple[str, int], float] = {}
    for key in events.Tags()["scalars"]:
        for e in events.Scalars(key):
            assert (key, e.step) not in board, f"{key} written twice at step {e.step}"
            board[key, e.step] = e.value
    assert {k: v for k, v in board.items() if not k[0].startswith("duration_s/")} == (
        pytest.approx(stored, rel=1e-6, abs=1e-7)  # event files hold float32
    )

    # `itergrpo runs` links the run to its MLflow page.
    assert itergrpo(["runs", "--store", str(store_dir)]) == 0
    assert f"MLflow run of {RUN_ID}: {tracked[1]}" in capsys.readouterr().out


@pytest.mark.slow
def test_an_ablation_is_one_parent_mlflow_run_with_a_child_per_arm_seed(
    tmp_path: Path, mlflow_server: str
) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "description: two arms, one seed, one iteration\n"
        "config: micro\n"
        "seeds: 1\n"
        "overrides: [run.iterations=1, tracking.mlflow.experiment=ablation,"
        f" tracking.mlflow.uri={mlflow_server}]\n"
        "arms:\n"
        "  grpo_os: [grpo.preset=grpo_os]\n"
        "  online_rft: [grpo.preset=online_rft]\n"
    )
    store_dir = tmp_path / "store"
    # In this process (nothing is killed here): a child process would add ~5 s of CPU imports.
    argv = ["ablate", "--suite", str(suite), "--ablation-id", "abl"]
    assert itergrpo([*argv, "--store", str(store_dir), "--no-prefect"]) == 0
    store = RunStore(store_dir)
    parent = mlflow_run(store.run_dir("abl"))
    assert parent is not None
    client = MlflowClient(mlflow_server)
    # Its own experiment on the module's server (the other test logs under the default).
    experiment = client.get_experiment_by_name("ablation")
    assert experiment is not None
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"abl", "abl-grpo_os-s0", "abl-online_rft-s0"}
    assert runs["abl"].info.run_id == parent[0]
    assert runs["abl"].info.status == "FINISHED"
    assert "mlflow.parentRunId" not in runs["abl"].data.tags
    # policy_0, shared by the arms, is evaluated in the parent run
    greedy = client.get_metric_history(parent[0], "eval/test/greedy_accuracy")
    assert [m.step for m in greedy] == [0]
    for arm in ("grpo_os", "online_rft"):
        child = runs[f"abl-{arm}-s0"]
        assert child.data.tags["mlflow.parentRunId"] == parent[0]
        assert (child.data.tags["arm"], child.data.tags["seed"]) == (arm, "0")
        assert child.data.params["grpo.preset"] == arm
        rewards = client.get_metric_history(child.info.run_id, "grpo/reward_mean")
        assert sorted(m.step for m in rewards) == [0, 1, 2]
