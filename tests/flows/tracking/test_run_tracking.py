"""RunTracking against a real MLflow store (sqlite) and real TensorBoard event files: a stage
committed before a kill but not yet sent is sent at the resume, once, to the same MLflow run."""

from __future__ import annotations

import json
from pathlib import Path

from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from flows.loop import tracked_run
from flows.tracking.record import RECORD_FILE, mlflow_run
from flows.tracking.run_tracking import RunTracking
from storage.store import RunStore
from tests.flow_helpers import micro_config


def _commit_grpo(store: RunStore, iteration: int, rewards: list[float]) -> None:
    with store.open_run("r", {}) as run, run.stage(iteration, "grpo") as attempt:
        attempt.write(
            "metrics",
            [
                {"stage": "grpo", "step": s, "name": "reward_mean", "value": v}
                for s, v in enumerate(rewards)
            ],
        )


def test_a_resume_sends_what_was_committed_unsent_and_nothing_twice(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "store")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = micro_config(
        store.root,
        "r",
        f"tracking.mlflow.uri={uri}",
        "tracking.tensorboard=true",
        "grpo.steps=2",
    )
    _commit_grpo(store, 0, [0.25, 0.5])
    first = RunTracking(cfg.tracking, tracked_run(cfg), store)
    first.sync({("grpo", 0): 7.0})
    _commit_grpo(store, 1, [0.75, 1.0])  # committed, then killed before it was sent
    first.trackers[1].close("interrupted")  # the event file a killed process leaves

    resumed = RunTracking(cfg.tracking, tracked_run(cfg), store)
    resumed.sync()
    resumed.sync()  # a stage done again with nothing new: nothing sent
    resumed.finish("interrupted")

    run_dir = store.run_dir("r")
    record = json.loads((run_dir / RECORD_FILE).read_text())
    tracked = mlflow_run(run_dir)
    assert tracked is not None
    run_id = tracked[0]
    assert record["mlflow"]["logged"] == ["params", "grpo:0", "grpo:1"]
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("itergrpo")
    assert experiment is not None
    assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == [run_id]
    run = client.get_run(run_id)
    assert run.info.status == "KILLED"
    assert run.data.params["grpo.steps"] == "2"
    assert run.data.tags["itergrpo.run_id"] == "r"
    assert run.data.tags["itergrpo.seed"] == "0"
    history = client.get_metric_history(run_id, "grpo/reward_mean")
    assert sorted((m.step, m.value) for m in history) == [(0, 0.25), (1, 0.5), (2, 0.75), (3, 1.0)]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "duration_s/grpo")] == [
        (0, 7.0)
    ]

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    scalars = [(e.step, e.value) for e in events.Scalars("grpo/reward_mean")]
    assert sorted(scalars) == [(0, 0.25), (1, 0.5), (2, 0.75), (3, 1.0)]


def test_a_completed_run_sends_the_report_its_caller_writes_only_to_a_tracker(
    tmp_path: Path,
) -> None:
    store = RunStore(tmp_path / "store")
    written: list[Path] = []

    def write_report(folder: Path) -> None:
        written.append(folder)
        folder.mkdir(parents=True)
        (folder / "summary.md").write_text("# what the run found")

    untracked = micro_config(store.root, "quiet")
    RunTracking(untracked.tracking, tracked_run(untracked), store).finish("completed", write_report)
    assert written == []  # no tracker: no report rendered for one

    cfg = micro_config(store.root, "r", "tracking.tensorboard=true")
    RunTracking(cfg.tracking, tracked_run(cfg), store).finish("completed", write_report)
    assert written == [store.root / "reports" / "r"]
    run_dir = store.run_dir("r")
    assert json.loads((run_dir / RECORD_FILE).read_text())["tensorboard"]["logged"] == ["report"]
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert "report/summary/text_summary" in events.Tags()["tensors"]
