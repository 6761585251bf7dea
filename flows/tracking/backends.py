"""The trackers a run reports to, behind one small protocol: MLflow (through MlflowClient, no
global active run) and TensorBoard (torch's SummaryWriter). Each imports its library when built,
so only a run that selects it needs it installed."""

from __future__ import annotations

import importlib.util
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from flows.tracking.config import TRACKING_EXTRA, MLflowSettings
from flows.tracking.points import MetricPoint
from grpo_core.contracts.errors import SettingError

# MLflow's own limits on one log_batch call and on a param's text.
_MLFLOW_PARAMS_PER_BATCH = 100
_MLFLOW_METRICS_PER_BATCH = 1000
_MLFLOW_PARAM_CHARS = 6000
# How long a tracking server may take to answer the pre-flight's request: one that is up
# answers in milliseconds, and MLflow's client would retry a dead one for minutes.
REACHABLE_SECONDS = 2.0


class Tracker(Protocol):
    """Where a run's params, metric points and files are also sent."""

    name: str

    def log_params(self, params: Mapping[str, str], tags: Mapping[str, str]) -> None:
        """The run's flattened config and its identity (store, run id, commit, seed)."""

    def log_points(self, points: Sequence[MetricPoint]) -> None:
        """Metric values at their steps; written through when this returns."""

    def log_files(self, directory: Path, under: str) -> None:
        """Every file of `directory`, as artifacts under `under` (where the tracker has them)."""

    def close(self, status: str) -> None:
        """End the tracker's run: 'completed', 'failed' or 'interrupted' (resumable)."""


def require_installed(field: str, module: str) -> None:
    """A SettingError naming the extra when `module` cannot be imported here."""
    if importlib.util.find_spec(module) is None:
        raise SettingError(
            f"{field} is set but {module} is not installed: {TRACKING_EXTRA}, or unset {field}"
        )


def require_reachable(field: str, uri: str) -> None:
    """A SettingError naming `field` when the tracking server at `uri` (http or https; other
    URIs are databases and folders, opened by the run itself) does not answer an HTTP request
    within REACHABLE_SECONDS. Any HTTP answer counts: a login page or an error still says a
    server is there."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=REACHABLE_SECONDS):
            return
    except urllib.error.HTTPError:  # an answer, if not the one a health check hopes for
        return
    except (OSError, ValueError) as exc:  # refused, timed out, unknown host, a malformed URI
        reason = getattr(exc, "reason", None) or exc
        if isinstance(reason, ssl.SSLError):  # a server answered (MLflow may be told to
            return  # accept its certificate: MLFLOW_TRACKING_INSECURE_TLS)
        raise SettingError(
            f"{field} = {uri} does not answer ({reason}, waited up to "
            f"{REACHABLE_SECONDS:.0f} s): start that MLflow server (`mlflow server --host "
            f"HOST --port PORT`), correct the URI, or unset {field}"
        ) from None


class MLflowTracker:
    """One MLflow run per itergrpo run; a resume reopens the run whose id it is given."""

    name = "mlflow"

    def __init__(self, settings: MLflowSettings, run_name: str, resume_run_id: str | None) -> None:
        from mlflow.tracking import MlflowClient

        assert settings.uri is not None
        self.uri = settings.uri
        self.client = MlflowClient(tracking_uri=settings.uri)
        experiment = self.client.get_experiment_by_name(settings.experiment)
        self.experiment_id: str = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(settings.experiment)
        )
        self.run_id = (
            self._reopened(resume_run_id)
            or self.client.create_run(self.experiment_id, run_name=run_name).info.run_id
        )

    def _reopened(self, run_id: str | None) -> str | None:
        """`run_id` marked running again; None if there is none (deleted, another server)."""
        from mlflow.exceptions import MlflowException

        if run_id is None:
            return None
        try:
            run = self.client.get_run(run_id)
        except MlflowException:
            return None
        if run.info.lifecycle_stage != "active" or run.info.experiment_id != self.experiment_id:
            return None
        self.client.update_run(run_id, status="RUNNING")
        return run_id

    @property
    def url(self) -> str:
        """The run's page in the MLflow UI when the URI is a server, else the URI and run id."""
        if self.uri.startswith(("http://", "https://")):
            base = self.uri.rstrip("/")
            return f"{base}/#/experiments/{self.experiment_id}/runs/{self.run_id}"
        return f"{self.uri} run {self.run_id}"

    def log_params(self, params: Mapping[str, str], tags: Mapping[str, str]) -> None:
        from mlflow.entities import Param, RunTag

        items = [Param(k, v[:_MLFLOW_PARAM_CHARS]) for k, v in params.items()]
        for i in range(0, len(items), _MLFLOW_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[i : i + _MLFLOW_PARAMS_PER_BATCH])
        self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def log_points(self, points: Sequence[MetricPoint]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(p.key, p.value, now, p.step) for p in points]
        for i in range(0, len(items), _MLFLOW_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=items[i : i + _MLFLOW_METRICS_PER_BATCH])

    def log_files(self, directory: Path, under: str) -> None:
        self.client.log_artifacts(self.run_id, str(directory), under)

    def close(self, status: str) -> None:
        mlflow_status = {"completed": "FINISHED", "failed": "FAILED"}.get(status, "KILLED")
        self.client.set_terminated(self.run_id, mlflow_status)


class TensorBoardTracker:
    """Event files in one log directory; a resume appends a new event file beside the old."""

    name = "tensorboard"

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = log_dir
        self.writer: Any = SummaryWriter(log_dir=str(log_dir))

    def log_params(self, params: Mapping[str, str], tags: Mapping[str, str]) -> None:
        self.writer.add_text("config", _markdown_table(params), global_step=0)
        self.writer.add_text("tags", _markdown_table(tags), global_step=0)
        self.writer.flush()

    def log_points(self, points: Sequence[MetricPoint]) -> None:
        for p in points:
            self.writer.add_scalar(p.key, p.value, global_step=p.step)
        self.writer.flush()

    def log_files(self, directory: Path, under: str) -> None:
        """TensorBoard keeps no files: the summary's text is shown under the Text tab."""
        for path in sorted(directory.glob("*.md")):
            self.writer.add_text(f"{under}/{path.stem}", path.read_text(), global_step=0)
        self.writer.flush()

    def close(self, status: str) -> None:
        self.writer.close()


def _markdown_table(values: Mapping[str, str]) -> str:
    rows = "\n".join(f"| {k} | {v} |" for k, v in sorted(values.items()))
    return "| name | value |\n|---|---|\n" + rows
