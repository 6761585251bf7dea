"""An MLflow URI with nothing listening is refused at pre-flight, within seconds, in one line
naming the field and the fix, instead of minutes of the client's retry warnings."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flows.tracking.config import MLflowSettings, TrackingSection
from flows.tracking.run_tracking import check_trackers
from grpo_core.contracts.errors import SettingError
from tests.flow_helpers import REPO
from tests.ports import free_port


def closed_loopback_uri() -> str:
    """A loopback URI nothing listens on (a port just bound and released)."""
    return f"http://127.0.0.1:{free_port()}"


def test_an_mlflow_server_that_is_down_is_refused_at_once() -> None:
    uri = closed_loopback_uri()
    began = time.monotonic()
    with pytest.raises(SettingError) as caught:
        check_trackers(TrackingSection(mlflow=MLflowSettings(uri=uri)))
    assert time.monotonic() - began < 5
    message = str(caught.value)
    assert message.startswith(f"tracking.mlflow.uri = {uri} does not answer (")
    assert "Connection refused" in message
    assert "`mlflow server" in message and message.endswith("unset tracking.mlflow.uri")
    assert "\n" not in message


def test_any_http_answer_counts_as_a_server_there() -> None:
    class LoginWall(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_error(401)  # a server behind a login: MLflow's client brings the token

        def log_message(self, *args: object) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), LoginWall) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            uri = f"http://127.0.0.1:{server.server_address[1]}"
            check_trackers(TrackingSection(mlflow=MLflowSettings(uri=uri)))
        finally:
            server.shutdown()


def test_a_folder_or_database_uri_needs_no_server(tmp_path: Path) -> None:
    for uri in (f"file:{tmp_path / 'mlruns'}", f"sqlite:///{tmp_path / 'mlflow.db'}"):
        check_trackers(TrackingSection(mlflow=MLflowSettings(uri=uri)))


def test_a_run_reporting_to_a_server_that_is_down_stops_in_seconds_writing_nothing(
    tmp_path: Path,
) -> None:
    uri, store = closed_loopback_uri(), tmp_path / "store"
    began = time.monotonic()
    out = subprocess.run(
        [
            *(sys.executable, "-m", "flows.cli", "run", "--config", "micro", "--no-prefect"),
            *("--store", str(store), "--set", f"tracking.mlflow.uri={uri}"),
        ],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,  # the MLflow client alone retried for minutes
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert time.monotonic() - began < 60
    errors = [line for line in out.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert errors[0].startswith(f"itergrpo run: error: tracking.mlflow.uri = {uri} does not answer")
    assert not (store / "runs").exists()  # refused before any write
