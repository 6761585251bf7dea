"""`itergrpo serve` end to end: a deployment triggered with partial parameters (as
`prefect deployment run --params` sends them) runs the served preset in the served store,
the flow run's logs, read back through the Prefect API, hold itergrpo's own lines, and a
cancel from the UI stops a run as Cancelled with the store's run `interrupted`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment
from prefect.settings import PREFECT_API_URL
from prefect.states import Cancelling

from storage.store import RunStore
from tests.flow_helpers import REPO

pytestmark = pytest.mark.slow


def _wait_for_deployment(name: str, serve: subprocess.Popen[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            assert serve.poll() is None, serve.stderr.read() if serve.stderr else ""
            try:
                client.read_deployment_by_name(name)
                return
            except Exception:  # not registered yet
                time.sleep(1)
    raise AssertionError(f"deployment {name} not registered within {timeout} s")


def _flow_run_log(flow_run: FlowRun, wanted: str, timeout: float) -> str:
    """The flow run's log lines as text, once `wanted` is among them (the API stores the
    lines a moment after the serving process sends them)."""
    deadline = time.monotonic() + timeout
    log_filter = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run.id]))
    with get_client(sync_client=True) as client:
        while True:
            text = "\n".join(r.message for r in client.read_logs(log_filter=log_filter))
            if wanted in text or time.monotonic() > deadline:
                return text
            time.sleep(1)


@pytest.mark.usefixtures("prefect_harness")
def test_a_served_deployment_merges_partial_parameters_and_logs_its_stages(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    env["OMP_NUM_THREADS"] = "1"
    # The runner looks for scheduled flow runs every 10 s by default: idle test time.
    env["PREFECT_RUNNER_POLL_FREQUENCY"] = "1"
    serve = subprocess.Popen(
        [
            *(sys.executable, "-m", "flows.cli", "serve", "--config", "micro"),
            *("--store", str(store), "--name", "t"),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_for_deployment("iterative-rl/t", serve, timeout=120)
        flow_run = run_deployment(
            "iterative-rl/t",
            parameters={"config": {"run": {"iterations": 1, "run_id": "served-1"}}},
            timeout=300,
            poll_interval=1,
        )
        assert isinstance(flow_run, FlowRun)  # the sync call returns the run itself
        assert flow_run.state is not None and flow_run.state.is_completed(), flow_run.state
        messages = _flow_run_log(flow_run, "iteration 0 (1 of 1): grpo done in", timeout=60)
        cancelled = _cancel_from_the_ui_midway(run_id="served-2")
    finally:
        _stop(serve)
    status = RunStore(store).run_status("served-1")
    assert (status["status"], status["iterations_done"]) == ("completed", 1)
    stored = yaml.safe_load((store / "runs" / "served-1" / "config.yaml").read_text())
    assert stored["warm_start"]["steps"] == 200  # micro's, not the class default 375
    assert "iteration 0 (1 of 1): grpo done in" in messages
    assert "GRPO iter 0 step 0: reward" in messages
    # a cancel from the UI ends the flow run Cancelled and leaves the run resumable
    assert cancelled.state is not None and cancelled.state.is_cancelled(), cancelled.state
    served_2 = RunStore(store).run_status("served-2")
    assert served_2["status"] == "interrupted", served_2.get("failure")


def _stop(serve: subprocess.Popen[str]) -> None:
    """SIGTERM to the serving process group, then SIGKILL if it is still up after 120 s:
    cleanup, not a check. Prefect's runner shuts down gracefully (pausing schedules through the
    API, up to 30 s of grace per flow-run process), which took over 60 s on 2 loaded cores."""
    os.killpg(serve.pid, signal.SIGTERM)
    try:
        serve.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(serve.pid, signal.SIGKILL)
        serve.wait(timeout=30)


def _cancel_from_the_ui_midway(run_id: str) -> FlowRun:
    """Trigger a run, cancel it through the API (the UI's Cancel button) once its first
    iteration has started, and return the flow run in its final state."""
    params = {"config": {"run": {"iterations": 3, "run_id": run_id}}}
    flow_run = run_deployment("iterative-rl/t", parameters=params, timeout=0)
    assert isinstance(flow_run, FlowRun)
    _flow_run_log(flow_run, "iteration 0 (1 of 3): rollout", timeout=180)
    deadline = time.monotonic() + 120
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run.id, Cancelling(), force=True)
        while time.monotonic() < deadline:
            flow_run = client.read_flow_run(flow_run.id)
            if flow_run.state is not None and flow_run.state.is_final():
                return flow_run
            time.sleep(1)
    raise AssertionError(f"flow run {run_id} not stopped 120 s after its cancel")
