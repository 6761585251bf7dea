"""A run that stops says why: the failure's type, message and stage stored in status.json and
shown by `itergrpo runs`; a second Ctrl-C leaves an `interrupted`, resumable run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from flows.cli import main
from flows.cli.store_commands import failure_line
from flows.loop import FAILURE_MESSAGE_CHARS, failure_record
from storage.store import RunStore
from tests.flow_helpers import cli


def test_failure_record_keeps_type_first_line_and_stage() -> None:
    record = failure_record(ValueError("bad shape (3, 4)\nsecond line"), ("grpo", 2))
    assert record == {
        "type": "ValueError",
        "message": "bad shape (3, 4)",
        "stage": "grpo",
        "iteration": 2,
    }
    outside = failure_record(KeyboardInterrupt(), None)
    assert outside == {"type": "KeyboardInterrupt", "message": "", "stage": None, "iteration": None}


def test_failure_record_shortens_a_long_message() -> None:
    message = failure_record(RuntimeError("x" * 1000), ("train_rm", 0))["message"]
    assert len(message) == FAILURE_MESSAGE_CHARS and message.endswith("...")


def test_failure_line_names_stage_iteration_type_and_message() -> None:
    record = failure_record(KeyError("ratio_max"), ("label", 1))
    assert failure_line(record) == "in label (iteration 1): KeyError: 'ratio_max'"
    assert failure_line(failure_record(OSError("disk"), None)) == "outside a stage: OSError: disk"


def test_a_failed_runs_reason_is_stored_and_shown_by_runs(
    bug_run: tuple[subprocess.CompletedProcess[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out, tmp_path = bug_run  # `itergrpo run` stopped by ValueError@warm_start:0:1
    assert out.returncode == 1, out.stderr[-2000:]
    status = RunStore(tmp_path).run_status("bug")
    assert status["status"] == "failed"
    assert status["failure"] == {
        "type": "ValueError",
        "message": "injected by ITERGRPO_FAULT=ValueError@warm_start:0:1",
        "stage": "warm_start",
        "iteration": 0,
    }
    assert main(["runs", "--store", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert "warm_start:0 ValueError" in shown  # the table's `stopped` column
    assert (
        "bug stopped in warm_start (iteration 0): ValueError: "
        "injected by ITERGRPO_FAULT=ValueError@warm_start:0:1"
    ) in shown


def test_runs_without_a_failure_have_no_stopped_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = RunStore(tmp_path)
    with store.open_run("fine", {"a": 1}) as run:
        run.set_status("completed", failure=None)
    assert main(["runs", "--store", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert "stopped" not in shown and "completed" in shown


def test_a_second_ctrl_c_leaves_the_run_interrupted_with_the_resume_command(
    tmp_path: Path,
) -> None:
    out = cli(
        tmp_path, "run", "--config", "micro", "--run-id", "ctrlc", fault="SIGINT*2@warm_start:0:1"
    )
    assert out.returncode == 130, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "KeyboardInterrupt" not in out.stderr
    assert "interrupted by a second SIGINT" in out.stderr
    assert f"itergrpo resume ctrlc --store {tmp_path}" in out.stderr
    status = json.loads((tmp_path / "runs" / "ctrlc" / "status.json").read_text())
    assert status["status"] == "interrupted"
    assert status["failure"]["type"] == "RunInterrupted"
    assert status["failure"]["stage"] == "warm_start"
    assert not RunStore(tmp_path).committed_stages("ctrlc")  # the stopped stage left nothing


def test_a_failed_ablation_stores_why(tmp_path: Path) -> None:
    out = cli(tmp_path, "ablate", "--suite", "micro", fault="ValueError@warm_start:0:1")
    assert out.returncode == 1, out.stderr[-2000:]
    status = RunStore(tmp_path).run_status("ablate-micro")
    assert status["status"] == "failed"
    assert status["failure"] == {
        "type": "ValueError",
        "message": "injected by ITERGRPO_FAULT=ValueError@warm_start:0:1",
        "stage": None,  # the ablation's own record: the arm run keeps the stage
        "iteration": None,
    }


def test_a_failure_that_cannot_be_recorded_still_reports_the_runs_own_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The disk that stopped the run may still be full when its failure is recorded: the run's
    own error is what the user sees, with a warning that the status could not be written."""
    from flows.interrupts import FAULT_ENV
    from flows.loop import execute_run
    from storage.errors import DiskFullError
    from storage.run_writer import RunWriter
    from tests.flow_helpers import micro_config

    real = RunWriter.set_status

    def full_when_failing(self: RunWriter, status: str, **kwargs: object) -> None:
        if status == "failed":
            raise DiskFullError("no space left to write status.json")
        real(self, status, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(RunWriter, "set_status", full_when_failing)
    monkeypatch.setenv(FAULT_ENV, "ValueError@warm_start:0:1")
    with pytest.raises(ValueError, match="injected by ITERGRPO_FAULT"):
        execute_run(micro_config(tmp_path, "full"))
    assert "could not record the run as failed: no space left" in caplog.text
    assert RunStore(tmp_path).run_status("full")["status"] == "running"  # left as it was
