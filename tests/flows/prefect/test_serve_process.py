"""`itergrpo serve` as a process: without PREFECT_API_URL it refuses with the two commands
to run (Prefect would serve against a temporary API no UI shows, and each flow run would
start a server of its own); served, it prints the deployment's UI page, and a SIGTERM stops
it and the run it is running within seconds, the run resumable, with one clean line
(Prefect's runner waited for the run to end)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage.store import RunStore
from tests.flow_helpers import REPO

SERVE = (sys.executable, "-m", "flows.cli", "serve", "--config", "micro")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def test_serve_without_a_server_refuses_with_the_commands_to_run(tmp_path: Path) -> None:
    out = subprocess.run(
        [*SERVE, "--store", str(tmp_path / "store")],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,  # it served, against a temporary API, until stopped
    )
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, out.stderr[-2000:]
    assert errors[0].startswith("itergrpo serve: error: PREFECT_API_URL is not set")
    assert "`prefect server start --host 127.0.0.1 --port 4200`" in errors[0]
    assert "`export PREFECT_API_URL=http://127.0.0.1:4200/api`" in errors[0]
    assert "Traceback" not in out.stderr


def _wait_for_line(path: Path, text: str, serve: subprocess.Popen[bytes], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shown = path.read_text()
        if text in shown:
            return shown
        assert serve.poll() is None, f"serve exited with {serve.returncode}: {shown[-2000:]}"
        time.sleep(0.5)
    raise AssertionError(f"serve did not print {text!r} within {timeout} s")


def _wait_until_running(status: Path, timeout: float) -> None:
    """Until the run's status says its first iteration is done (it is mid-run)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            if json.loads(status.read_text())["iterations_done"] >= 1:
                return
        time.sleep(0.5)
    raise AssertionError(f"the served run did not finish an iteration within {timeout} s")


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_sigterm_stops_serve_and_its_run_within_seconds_with_one_clean_line(
    tmp_path: Path,
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL

    api, store = str(PREFECT_API_URL.value()), tmp_path / "store"
    stdout, stderr = tmp_path / "stdout", tmp_path / "stderr"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        serve = subprocess.Popen(
            [*SERVE, "--store", str(store), "--name", "sigterm"],
            cwd=REPO,
            # the runner looks for scheduled flow runs every 10 s by default: idle test time
            env=_env(PREFECT_API_URL=api, PREFECT_RUNNER_POLL_FREQUENCY="1"),
            stdout=out,
            stderr=err,
            start_new_session=True,  # its own group: the cleanup below reaches all of it
        )
    try:
        shown = _wait_for_line(stdout, "stop with Ctrl-C or SIGTERM", serve, timeout=180)
        assert f"{api.removesuffix('/api')}/deployments/deployment/" in shown  # the UI page
        # a run of many short iterations, stopped in its second
        params = {"config": {"run": {"iterations": 50, "run_id": "long"}}}
        flow_run = run_deployment("iterative-rl/sigterm", parameters=params, timeout=0)
        _wait_until_running(store / "runs" / "long" / "status.json", timeout=180)
        os.kill(serve.pid, signal.SIGTERM)  # serve alone, as `kill PID` sends it
        sent = time.monotonic()
        code = serve.wait(timeout=60)  # it waited for the run to end: minutes, or hours
        seconds = time.monotonic() - sent
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
            serve.wait(timeout=30)
    said = stderr.read_text()
    assert code == 0, said[-2000:]
    assert seconds < 20, f"{seconds:.1f} s after SIGTERM"  # 5 s on an idle machine
    assert "itergrpo serve: stopped by SIGTERM (iterative-rl/sigterm stays registered" in said
    assert "Traceback" not in said and "never awaited" not in said
    status = RunStore(store).run_status("long")
    assert status["status"] == "interrupted" and status["iterations_done"] < 50  # resumable
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run.id).state
    assert state is not None and state.is_cancelled(), state
