"""One run's tracking: opens its trackers (reopening the MLflow run and TensorBoard folder of a
resumed run), sends each committed stage once, from the store, and ends them. What was sent
is recorded in runs/<run_id>/tracking.json, written atomically after each send, so a stage
redone after a kill is sent once, with its committed values. The caller hands over what is
sent besides the store's rows (TrackedRun, the report's writer): tracking reads no config."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import flows
from flows.tracking.backends import (
    MLflowTracker,
    TensorBoardTracker,
    Tracker,
    require_installed,
    require_reachable,
)
from flows.tracking.config import TrackingSection
from flows.tracking.points import duration_point, flatten_config, stage_points
from flows.tracking.record import read_record, write_record
from storage.store import RunStore

log = logging.getLogger("itergrpo")

PARAMS = "params"  # the record's entry for the config and tags
REPORT = "report"  # ... for the report's files
ReportWriter = Callable[[Path], object]  # writes the run's report files into the folder given


@dataclass(frozen=True)
class TrackedRun:
    """What the trackers are told of a run besides its stored rows: its id and seed (tags), its
    config as JSON (params, flattened) and its GRPO steps per iteration (a step's point goes
    at its step counted over the run)."""

    run_id: str
    seed: int
    grpo_steps: int
    config: Mapping[str, Any]


def check_trackers(tracking: TrackingSection) -> None:
    """Fail before any stage when a configured tracker's library is not installed, or its
    server does not answer (at once, not after minutes of the client's retries)."""
    if tracking.mlflow.uri is not None:
        require_installed("tracking.mlflow.uri", "mlflow")
        require_reachable("tracking.mlflow.uri", tracking.mlflow.uri)
    if tracking.tensorboard is not False:
        require_installed("tracking.tensorboard", "tensorboard")


def tensorboard_dir(tracking: TrackingSection, run_dir: Path) -> Path | None:
    """The TensorBoard log directory: given (relative to the working directory), or
    runs/<run_id>/tensorboard for `true`; absolute, so a resume elsewhere finds it."""
    if tracking.tensorboard is False:
        return None
    if tracking.tensorboard is True:
        return (run_dir / "tensorboard").resolve()
    return Path(tracking.tensorboard).expanduser().resolve()


def itergrpo_commit() -> str | None:
    """The git commit of the itergrpo checkout running, None outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(flows.__file__).resolve().parent.parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


class RunTracking:
    """The trackers of one run and what each has been sent."""

    def __init__(self, tracking: TrackingSection, run: TrackedRun, store: RunStore) -> None:
        self.tracking, self.run, self.store, self.run_id = tracking, run, store, run.run_id
        run_dir = store.run_dir(self.run_id)
        self.run_dir = run_dir
        self.record = read_record(run_dir)
        self.trackers: list[Tracker] = []
        settings = tracking.mlflow
        if settings.uri is not None:
            where = {"uri": settings.uri, "experiment": settings.experiment}
            earlier = self.record.get("mlflow", {})
            same_place = all(earlier.get(k) == v for k, v in where.items())
            mlflow = MLflowTracker(
                settings, self.run_id, earlier.get("run_id") if same_place else None
            )
            if mlflow.run_id != earlier.get("run_id"):  # a new MLflow run: nothing sent yet
                self.record["mlflow"] = {**where, "run_id": mlflow.run_id, "logged": []}
            self.record["mlflow"]["url"] = mlflow.url
            self.trackers.append(mlflow)
        log_dir = tensorboard_dir(tracking, run_dir)
        if log_dir is not None:
            if self.record.get("tensorboard", {}).get("log_dir") != str(log_dir):
                self.record["tensorboard"] = {"log_dir": str(log_dir), "logged": []}
            self.trackers.append(TensorBoardTracker(log_dir))
        self._save()

    def _save(self) -> None:
        write_record(self.run_dir, self.record)

    def _sent(self, tracker: Tracker, what: str) -> None:
        self.record[tracker.name]["logged"].append(what)
        self._save()

    def tags(self) -> dict[str, str]:
        tags = {
            "itergrpo.run_id": self.run_id,
            "itergrpo.store": str(self.store.root.resolve()),
            "itergrpo.seed": str(self.run.seed),
        }
        commit = itergrpo_commit()
        if commit is not None:
            tags["itergrpo.git_commit"] = commit
        return {**tags, **self.tracking.mlflow.tags}

    @property
    def mlflow_run_id(self) -> str | None:
        """The MLflow run this run reports to, None without MLflow."""
        entry = self.record.get("mlflow") if self.tracking.mlflow.uri else None
        return None if entry is None else str(entry["run_id"])

    def sync(self, seconds: Mapping[tuple[str, int], float] | None = None) -> None:
        """Send every committed stage a tracker has not been sent (and the config first);
        `seconds`: durations the loop measured, by (stage, iteration)."""
        if not self.trackers:
            return
        seconds = seconds or {}
        committed = self.store.committed_stages(self.run_id)
        for tracker in self.trackers:
            logged = set(self.record[tracker.name]["logged"])
            if PARAMS not in logged:
                tracker.log_params(flatten_config(self.run.config), self.tags())
                self._sent(tracker, PARAMS)
            for row in committed:
                stage, iteration = str(row["stage"]), int(row["iteration"])
                if f"{stage}:{iteration}" in logged:
                    continue
                points = stage_points(
                    self.store, self.run_id, stage, iteration, self.run.grpo_steps
                )
                if (stage, iteration) in seconds:
                    points.append(duration_point(stage, iteration, seconds[stage, iteration]))
                tracker.log_points(points)
                self._sent(tracker, f"{stage}:{iteration}")

    def finish(self, status: str, report: ReportWriter | None = None) -> None:
        """End every tracker's run; a completed run's report (plots, summary), written by
        `report` into <store>/reports/<run_id> only when there is a tracker, is sent first."""
        if not self.trackers:
            return
        if status == "completed" and report is not None:
            report_dir = self.store.root / "reports" / self.run_id
            report(report_dir)
            for tracker in self.trackers:
                if REPORT not in self.record[tracker.name]["logged"]:
                    tracker.log_files(report_dir, REPORT)
                    self._sent(tracker, REPORT)
        for tracker in self.trackers:
            tracker.close(status)

    def finish_after_error(self, status: str) -> None:
        """End the trackers' runs as 'failed' or 'interrupted' while an error propagates: a
        tracker that fails now is logged, so the run's own error is the one shown."""
        try:
            self.finish(status)
        except Exception:
            log.warning("could not end the tracking run", exc_info=True)
