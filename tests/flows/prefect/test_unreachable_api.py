"""A PREFECT_API_URL that points at a server that is down: one line with the fixes, exit 2,
and nothing written, instead of minutes of retries and a long traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from flows.errors import PrefectApiError
from flows.prefect_server import check_api_answers
from tests.flow_helpers import REPO


def closed_loopback_url() -> str:
    """A loopback URL nothing listens on (a port just bound and released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/api"


def test_a_closed_port_is_refused_with_the_fixes() -> None:
    url = closed_loopback_url()
    with pytest.raises(PrefectApiError) as caught:
        check_api_answers(url)
    message = str(caught.value)
    assert message.startswith(f"PREFECT_API_URL={url} does not answer (ConnectError")
    assert "`prefect server start`" in message
    assert "unset PREFECT_API_URL" in message and "--no-prefect" in message
    assert "\n" not in message


@pytest.mark.parametrize("command", ["run", "serve"])
def test_cli_with_an_unreachable_api_is_one_line_exit_2(tmp_path: Path, command: str) -> None:
    url = closed_loopback_url()
    env = {**os.environ, "PREFECT_API_URL": url, "OMP_NUM_THREADS": "1"}
    args = ["--config", "micro", "--store", str(tmp_path / "store")]
    if command == "run":
        args += ["--run-id", "down"]
    out = subprocess.run(
        [sys.executable, "-m", "flows.cli", command, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, out.stderr[-2000:]
    assert errors[0].startswith(
        f"itergrpo {command}: error: PREFECT_API_URL={url} does not answer (ConnectError: "
    )
    fixes = {
        "run": "start that server (`prefect server start`), unset PREFECT_API_URL to let the "
        "run start a temporary one, or pass --no-prefect",
        # serve needs a server of its own choosing: no temporary one, no --no-prefect
        "serve": "start that server (`prefect server start`), or point PREFECT_API_URL at one",
    }
    assert errors[0].endswith(f"; {fixes[command]}")
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "store" / "runs").exists()  # refused before any write
