"""The run's tracking record, runs/<run_id>/tracking.json: per tracker, where it logs (the
MLflow URI, experiment, run id and page; the TensorBoard folder) and what it has been sent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from storage.atomic import atomic_write_text

RECORD_FILE = "tracking.json"


def read_record(run_dir: Path) -> dict[str, Any]:
    """The run's tracking record ({} when it never tracked)."""
    path = run_dir / RECORD_FILE
    record: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    return record


def write_record(run_dir: Path, record: dict[str, Any]) -> None:
    """Replace the record atomically: a kill leaves the old one or the new one."""
    atomic_write_text(run_dir / RECORD_FILE, json.dumps(record, indent=1, sort_keys=True))


def mlflow_run(run_dir: Path) -> tuple[str, str] | None:
    """The MLflow run id and run page (a server's URL, else the URI and run id) a run reports
    to, if it does."""
    entry = read_record(run_dir).get("mlflow")
    return None if entry is None else (str(entry["run_id"]), str(entry["url"]))
