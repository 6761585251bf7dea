"""`itergrpo run/resume/report` on bad input: clear errors, nothing stored is touched."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.cli import main
from storage.store import RunStore
from tests.flow_helpers import REPO, commit_a_stage


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_invalid_value_names_field_and_range(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, text = run_cli(
        capsys, "run", "--config", "micro", "--store", str(tmp_path), "--set", "grpo.steps=0"
    )
    assert code == 2
    assert "grpo.steps" in text and "greater than or equal to 1" in text
    assert not (tmp_path / "runs").exists()


def test_missing_model_path_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-model"
    code, text = run_cli(
        capsys,
        "run",
        "--config",
        "micro",
        "--store",
        str(tmp_path / "store"),
        "--no-prefect",
        "--set",
        "policy.kind=local",
        "--set",
        f"policy.path={missing}",
    )
    assert code == 2
    assert str(missing) in text and "config.json" in text


def test_existing_run_with_another_config_is_refused_unless_forced(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    store = RunStore(tmp_path)
    commit_a_stage(store, "r1", {"run": {"seed": 0}})
    code, text = run_cli(
        capsys,
        "run",
        "--config",
        "micro",
        "--store",
        str(tmp_path),
        "--run-id",
        "r1",
        "--no-prefect",
        "--set",
        "run.iterations=1",
        "--set",
        "run.warm_start=false",
        "--set",
        "grpo.steps=1",
    )
    assert code == 2 and "--force-config" in text
    assert store.run_config("r1") == {"run": {"seed": 0}}


def test_second_run_on_a_locked_run_is_refused_naming_the_holder(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from storage.store import RunStore; "
            f"w = RunStore({str(tmp_path)!r}).open_run('r1', {{}}); "
            "print('held', flush=True); time.sleep(60)",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        code, text = run_cli(capsys, "resume", "r1", "--store", str(tmp_path), "--no-prefect")
        assert code == 2 and str(holder.pid) in text
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.1)


def test_resume_of_an_unknown_run_says_which(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, text = run_cli(capsys, "resume", "nope", "--store", str(tmp_path), "--no-prefect")
    assert code == 2 and "nope" in text


@pytest.mark.parametrize("option", ["--store", "--run-id"])
def test_an_empty_store_or_run_id_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option: str
) -> None:
    monkeypatch.chdir(tmp_path)
    code, text = run_cli(capsys, "run", "--config", "micro", "--no-prefect", option, "")
    assert code == 2
    assert f"{option}: must not be empty" in text
    assert list(tmp_path.iterdir()) == []  # nothing created, not even the default store


def test_a_folder_of_other_files_is_not_taken_for_a_store(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "thesis.tex").write_text("mine")
    code, text = run_cli(
        capsys, "run", "--config", "micro", "--no-prefect", "--store", str(tmp_path)
    )
    assert code == 2 and "not an itergrpo store" in text
    assert [p.name for p in tmp_path.iterdir()] == ["thesis.tex"]


def test_help_lists_every_command_without_loading_torch_or_prefect() -> None:
    code = (
        "import sys, contextlib, io\n"
        "from flows.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    main(['--help'])\n"
        "print(out.getvalue())\n"
        "print('heavy:', sorted(m for m in ('torch', 'prefect') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    for command in ("sql", "tables", "runs", "run", "demo", "resume", "report", "serve", "ablate"):
        assert f"    {command} " in done.stdout
    assert "heavy: []" in done.stdout
