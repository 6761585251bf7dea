"""A full disk and a hand-damaged run record: one-line errors naming the file and the fix,
with the store left as it was (hashed listing before and after)."""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import storage.atomic
from flows.cli import main
from storage.atomic import atomic_directory, atomic_write_parquet
from storage.errors import DamagedRunRecordError, DiskFullError, StoreError
from storage.store import RunStore
from tests.flow_helpers import commit_a_stage


def listing(root: Path) -> dict[str, str]:
    """Every file under `root` (hidden temp files included) with the hash of its bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _fill_then_fail(code: int) -> Any:
    """A pq.write_table that writes part of the file, then runs out of space as a disk does."""

    def write_table(table: pa.Table, where: Any, **kwargs: Any) -> None:
        Path(where).write_bytes(b"PAR1 partial")
        raise OSError(code, "simulated", str(where))

    return write_table


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_file_write_on_a_full_disk_is_one_line_and_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    path = tmp_path / "t.parquet"
    atomic_write_parquet(path, pa.table({"x": [1]}))
    before = listing(tmp_path)
    monkeypatch.setattr(storage.atomic.pq, "write_table", _fill_then_fail(code))
    with pytest.raises(DiskFullError) as caught:
        atomic_write_parquet(path, pa.table({"x": [2]}))
    message = str(caught.value)
    assert message.startswith(f"no space left to write {path} (")
    assert "free space on that disk" in message and "then resume the run" in message
    assert "\n" not in message
    assert listing(tmp_path) == before  # the old file, and no partial temp file


def test_other_os_errors_are_not_called_a_full_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage.atomic.pq, "write_table", _fill_then_fail(errno.EIO))
    with pytest.raises(OSError) as caught:
        atomic_write_parquet(tmp_path / "t.parquet", pa.table({"x": [1]}))
    assert not isinstance(caught.value, DiskFullError) and caught.value.errno == errno.EIO
    assert listing(tmp_path) == {}


def test_a_checkpoint_directory_on_a_full_disk_keeps_the_old_checkpoint(tmp_path: Path) -> None:
    final = tmp_path / "iter-0"
    with atomic_directory(final) as tmp:
        (tmp / "model.safetensors").write_bytes(b"old weights")
    before = listing(tmp_path)
    with (
        pytest.raises(DiskFullError) as caught,
        atomic_directory(final, overwrite=True) as tmp,
    ):
        (tmp / "model.safetensors").write_bytes(b"half of the new")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert str(caught.value).startswith(f"no space left to write {final} (")
    assert listing(tmp_path) == before


def test_a_stage_that_runs_out_of_space_commits_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RunStore(tmp_path)
    commit_a_stage(store, "r", {"a": 1})
    tables_before = listing(tmp_path / "tables")
    monkeypatch.setattr(storage.atomic.pq, "write_table", _fill_then_fail(errno.ENOSPC))
    with (
        pytest.raises(DiskFullError),
        store.open_run("r", {"a": 1}) as run,
        run.stage(0, "t") as attempt,
    ):
        attempt.write("metrics", [{"stage": "t", "name": "x", "value": 2.0}])
    assert listing(tmp_path / "tables") == tables_before
    assert [s["stage"] for s in store.committed_stages("r")] == ["s"]
    assert isinstance(DiskFullError("x"), StoreError)  # the CLI prints it as one line, exit 2


def _damage(store: Path, name: str, text: str) -> Path:
    path = store / "runs" / "r" / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "reason"),
    [("{not json", "not JSON (Expecting property name"), ('["a list"]', "the JSON holds a list")],
)
def test_a_damaged_status_json_names_the_file_and_the_fix(
    tmp_path: Path, text: str, reason: str
) -> None:
    commit_a_stage(RunStore(tmp_path), "r", {"a": 1})
    path = _damage(tmp_path, "status.json", text)
    with pytest.raises(DamagedRunRecordError) as caught:
        RunStore(tmp_path).run_status("r")
    message = str(caught.value)
    assert message.startswith(f"damaged run record {path}: {reason}")
    assert "restore it from a backup, or delete it" in message and "\n" not in message
    before = listing(tmp_path)
    with pytest.raises(DamagedRunRecordError):  # the pre-flight refuses before any write
        RunStore(tmp_path).check_can_open("r", {"a": 1})
    with pytest.raises(DamagedRunRecordError), RunStore(tmp_path).open_run("r", {"a": 1}) as run:
        run.set_status("running")
    assert {k: v for k, v in listing(tmp_path).items() if k != "runs/r/lock"} == {
        k: v for k, v in before.items() if k != "runs/r/lock"
    }


@pytest.mark.parametrize(
    ("text", "reason"),
    [("a: [unclosed\n", "not YAML (while parsing"), ("just a string\n", "the YAML holds a str")],
)
def test_a_damaged_config_yaml_names_the_file_and_the_fix(
    tmp_path: Path, text: str, reason: str
) -> None:
    commit_a_stage(RunStore(tmp_path), "r", {"a": 1})
    path = _damage(tmp_path, "config.yaml", text)
    before = listing(tmp_path)
    for attempt in (
        lambda: RunStore(tmp_path).run_config("r"),
        lambda: RunStore(tmp_path).check_can_open("r", {"a": 1}),
        lambda: RunStore(tmp_path).open_run("r", {"a": 1}),
    ):
        with pytest.raises(DamagedRunRecordError) as caught:
            attempt()
        message = str(caught.value)
        assert message.startswith(f"damaged run record {path}: {reason}")
        assert "put back the config the run was started with" in message
        assert "\n" not in message
    assert listing(tmp_path) == before


def test_force_config_writes_a_damaged_config_anew_and_keeps_the_damaged_file(
    tmp_path: Path,
) -> None:
    commit_a_stage(RunStore(tmp_path), "r", {"a": 1})
    path = _damage(tmp_path, "config.yaml", "a: [unclosed\n")
    store = RunStore(tmp_path)
    store.check_can_open("r", {"a": 1}, force_config=True)
    with store.open_run("r", {"a": 1}, force_config=True):
        pass
    assert store.run_config("r") == {"a": 1}
    kept = list(path.parent.glob("config.*.yaml"))
    assert [p.read_text() for p in kept] == ["a: [unclosed\n"]
    _damage(tmp_path, "config.yaml", "- a list\n")
    with pytest.raises(DamagedRunRecordError, match="--force-config"):  # the fix named
        store.run_config("r")


def test_cli_resume_of_a_damaged_config_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    commit_a_stage(RunStore(tmp_path), "r", {"a": 1})
    path = _damage(tmp_path, "config.yaml", "a: [unclosed\n")
    before = listing(tmp_path)
    assert main(["resume", "r", "--store", str(tmp_path), "--no-prefect"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"itergrpo resume: error: damaged run record {path}: not YAML")
    assert "\n" not in err
    assert listing(tmp_path) == before


def test_runs_lists_a_damaged_run_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    commit_a_stage(RunStore(tmp_path), "r", {"a": 1})
    with RunStore(tmp_path).open_run("ok", {"a": 1}) as run:
        run.set_status("completed")
    path = _damage(tmp_path, "status.json", "{not json")
    assert main(["runs", "--store", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    cells = [[c.strip() for c in line.split("|")] for line in out.splitlines() if "|" in line]
    rows = {row[0]: row[1] for row in cells[1:]}
    assert rows["r"] == "damaged" and rows["ok"] == "completed"
    assert f"damaged run record {path}: not JSON" in out
    assert json.loads((tmp_path / "runs" / "ok" / "status.json").read_text())["status"] == (
        "completed"
    )


def test_a_library_that_hides_enospc_is_still_a_full_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """safetensors and torch.save report a full disk as their own errors (SafetensorError,
    'PytorchStreamWriter failed writing file'): the disk itself is asked whether it is full."""
    final = tmp_path / "iter-1"
    usage = shutil.disk_usage(tmp_path)
    full = usage._replace(free=4096)
    monkeypatch.setattr(storage.atomic.shutil, "disk_usage", lambda _: full)
    with (
        pytest.raises(DiskFullError) as caught,
        atomic_directory(final) as tmp,
    ):
        (tmp / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")
    assert str(caught.value).startswith(f"no space left to write {final} (No space left")
    assert listing(tmp_path) == {}

    monkeypatch.setattr(storage.atomic.shutil, "disk_usage", lambda _: usage)  # room enough
    with pytest.raises(RuntimeError, match="a bug"), atomic_directory(final):
        raise RuntimeError("a bug")  # not a full disk: the traceback is kept
