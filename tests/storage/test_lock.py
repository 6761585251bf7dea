"""The run lock across processes, stale-lock takeover, and a SIGKILL in the middle of a stage."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from storage.errors import RunLockedError
from storage.store import RunStore
from tests.flow_helpers import REPO


def start_holder(root: Path, body: str = "") -> subprocess.Popen[str]:
    """A child process that opens run r1 for writing, runs `body`, says 'ready', then waits."""
    code = (
        textwrap.dedent(
            f"""
        import sys, time
        from storage.store import RunStore
        run = RunStore({str(root)!r}).open_run("r1", {{}})
        """
        )
        + textwrap.dedent(body)
        + "\nprint('ready', flush=True)\nsys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_second_process_gets_run_locked_error_naming_the_holder(tmp_path: Path) -> None:
    holder = start_holder(tmp_path)
    try:
        with pytest.raises(RunLockedError, match=f"PID {holder.pid}") as err:
            RunStore(tmp_path).open_run("r1", {})
        assert err.value.pid == holder.pid
    finally:
        holder.communicate("")


def test_stale_lock_of_a_dead_process_is_taken_over_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    holder = start_holder(tmp_path)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with (
        caplog.at_level(logging.WARNING),
        RunStore(tmp_path).open_run("r1", {}),
        pytest.raises(RunLockedError),
    ):
        RunStore(tmp_path).open_run("r1", {})
    assert f"PID {holder.pid}" in caplog.text and "stale" in caplog.text
    assert not (tmp_path / "runs" / "r1" / "lock").exists()


def test_sigkill_between_write_and_commit_leaves_nothing_visible(tmp_path: Path) -> None:
    holder = start_holder(
        tmp_path,
        """
        attempt = run.stage(0, "label").__enter__()
        attempt.write("orm_labels", [{"problem_id": "p", "sample_index": 0, "label": 1}])
        """,
    )
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    store = RunStore(tmp_path)
    leftover = tmp_path / "attempts/uncommitted/orm_labels/run_id=r1/iteration=0/label-1.parquet"
    assert leftover.exists()
    assert store.read("orm_labels").num_rows == 0
    with store.open_run("r1", {}) as run:
        assert not run.is_committed(0, "label")
        with run.stage(0, "label") as attempt:
            attempt.write("orm_labels", [{"problem_id": "q", "sample_index": 1, "label": 0}])
    assert not leftover.exists()
    assert store.read("orm_labels").column("problem_id").to_pylist() == ["q"]
