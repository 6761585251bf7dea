"""A run finishes on the data it started on (issue 55, Why 1): its config stores data paths
absolute and a fingerprint of each data file beside it, checked when the run starts again and
when another run forks its stages. The stages are stand-ins that read the task's training data,
commit, and stop as a Ctrl-C would, so each start is the CLI's own (pre-flight, store, loop)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

import flows.loop
from flows.ablate.run import run_ablation
from flows.ablate.suites import AblationPlan, Suite
from flows.cli import main
from flows.config import ItergrpoConfig
from flows.config_files import load_config
from flows.context import RunContext
from flows.data_identity import data_now, record_data
from flows.errors import DataChangedError
from flows.fork import fork_from, prefix_from
from flows.interrupts import RunInterrupted
from flows.loop import Executor, StageFn
from flows.stages import StageResult
from storage.store import RunStore

SUMS = [(a, b) for a in range(1, 7) for b in range(1, 7)]


def write_sums(path: Path, sums: list[tuple[int, int]] = SUMS) -> Path:
    """GSM8K-format rows `What is a+b?`, one per line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {"question": f"What is {a}+{b}?", "answer": f"{a}+{b}={a + b}\n#### {a + b}"}
        for a, b in sums
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def questions(sums: list[tuple[int, int]]) -> set[str]:
    return {f"What is {a}+{b}?" for a, b in sums}


LOCAL = ("--set", "task.name=local_files")


def reading_stages(
    seen: list[set[str]], *, commit: bool = True
) -> Callable[[RunContext], Executor]:
    """Stages that note the training questions the run reads, commit (or not), then stop."""

    def make(ctx: RunContext) -> Executor:
        def execute(name: str, iteration: int, fn: StageFn) -> StageResult:
            seen.append({p.question for p in ctx.task.problems("train", 5, 0)})
            if commit:
                with ctx.run.stage(iteration, name) as attempt:
                    attempt.write("metrics", [{"stage": name, "name": "x", "value": 1.0}])
            raise RunInterrupted("stopped after one stage")

        return execute

    return make


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[set[str]]:
    """The questions each stand-in stage read; the CLI's runs use the stand-in stages."""
    out: list[set[str]] = []
    real = flows.loop.execute_run
    monkeypatch.setattr(
        flows.loop, "execute_run", functools.partial(real, make_executor=reading_stages(out))
    )
    return out


def itergrpo(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main([*args, "--no-prefect"])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def start(capsys: pytest.CaptureFixture[str], store: Path, data: str, *more: str) -> str:
    """`itergrpo run --config micro` on local data `data`, stopped after its first stage."""
    code, text = itergrpo(
        capsys,
        *("run", "--config", "micro", "--store", str(store), "--run-id", "r"),
        *LOCAL,
        *("--set", f"task.local_files.path={data}", *more),
    )
    assert code == 130, text
    return text


def resume(capsys: pytest.CaptureFixture[str], store: Path) -> tuple[int, str]:
    return itergrpo(capsys, "resume", "r", "--store", str(store))


def record_files(store: Path) -> dict[str, bytes]:
    """Every file of run r's record (config, status, data), for 'nothing was written'."""
    return {p.name: p.read_bytes() for p in sorted((store / "runs" / "r").iterdir()) if p.is_file()}


def test_a_resume_from_another_directory_reads_the_data_the_run_started_on(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    seen: list[set[str]],
) -> None:
    started, elsewhere, store = tmp_path / "project", tmp_path / "elsewhere", tmp_path / "store"
    write_sums(started / "sums.jsonl")
    other = [(a, b) for a in range(7, 10) for b in range(7, 10)]
    write_sums(elsewhere / "sums.jsonl", other)  # the same relative path names other data there
    monkeypatch.chdir(started)
    start(capsys, store, "sums.jsonl")
    monkeypatch.chdir(elsewhere)
    code, text = resume(capsys, store)
    assert code == 130, text
    assert len(seen) == 2 and seen[1] <= questions(SUMS)  # read the project's file, not the other
    stored = yaml.safe_load((store / "runs" / "r" / "config.yaml").read_text())
    assert stored["task"]["local_files"]["path"] == str(started / "sums.jsonl")


def test_data_edited_between_start_and_resume_is_refused_naming_the_file_and_the_choices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], seen: list[set[str]]
) -> None:
    data, store = write_sums(tmp_path / "sums.jsonl"), tmp_path / "store"
    start(capsys, store, str(data))
    with data.open("a") as file:
        file.write(json.dumps({"question": "What is 9+9?", "answer": "9+9=18\n#### 18"}) + "\n")
    before = record_files(store)
    code, text = resume(capsys, store)
    assert code == 2
    [line] = [x for x in text.splitlines() if ": error: " in x]
    assert f"task.local_files.path {data} has changed since run 'r' read it" in line
    assert "(36 rows," in line and "37 rows," in line
    assert "Restore the data the run started on, or start a new run (another run id)" in line
    assert len(seen) == 1 and record_files(store) == before  # refused before any work or write


def test_data_removed_since_the_start_is_refused_naming_what_it_held(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], seen: list[set[str]]
) -> None:
    data, store = write_sums(tmp_path / "sums.jsonl"), tmp_path / "store"
    start(capsys, store, str(data))
    data.unlink()
    code, text = resume(capsys, store)
    assert code == 2 and f"task.local_files.path {data} is gone (it held 36 rows, " in text


def test_a_run_that_committed_nothing_reruns_on_the_new_data_and_records_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[set[str]] = []
    real = flows.loop.execute_run
    stages = reading_stages(seen, commit=False)
    monkeypatch.setattr(flows.loop, "execute_run", functools.partial(real, make_executor=stages))
    data, store = write_sums(tmp_path / "sums.jsonl"), tmp_path / "store"
    start(capsys, store, str(data))
    write_sums(data, SUMS[:30])
    start(capsys, store, str(data))
    record = json.loads((store / "runs" / "r" / "data.json").read_text())
    assert record["task.local_files.path"]["rows"] == 30
    assert [p.name for p in (store / "runs" / "r").glob("data.*.json")]  # the first one, kept


def test_force_config_goes_on_with_the_changed_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], seen: list[set[str]]
) -> None:
    data, store = write_sums(tmp_path / "sums.jsonl"), tmp_path / "store"
    start(capsys, store, str(data))
    write_sums(data, SUMS[:30])
    start(capsys, store, str(data), "--force-config")
    assert len(seen) == 2
    record = json.loads((store / "runs" / "r" / "data.json").read_text())
    assert record["task.local_files.path"]["rows"] == 30


def test_a_run_stored_with_a_relative_path_resumes_where_it_started_then_is_checked(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    seen: list[set[str]],
) -> None:
    """A run of an earlier version: config.yaml with the path as typed, no data record."""
    data, store = write_sums(tmp_path / "sums.jsonl"), RunStore(tmp_path / "store")
    tree = load_config(
        "micro", ["run.run_id=r", "task.name=local_files", f"task.local_files.path={data}"]
    ).model_dump(mode="json")
    tree["task"]["local_files"]["path"] = "sums.jsonl"
    with store.open_run("r", tree) as run, run.stage(0, "warm_start") as attempt:
        attempt.write("metrics", [{"stage": "warm_start", "name": "x", "value": 1.0}])
    monkeypatch.chdir(tmp_path)
    code, text = resume(capsys, store.root)
    assert code == 130, text
    assert "run r has no record of its data" in caplog.text and str(data) in caplog.text
    assert store.run_config("r")["task"]["local_files"]["path"] == str(data)
    assert (
        json.loads((store.run_dir("r") / "data.json").read_text())["task.local_files.path"]["rows"]
        == 36
    )
    write_sums(data, SUMS[:30])
    code, text = resume(capsys, store.root)
    assert code == 2 and "has changed since run 'r' read it" in text


def test_a_damaged_data_record_is_one_line_naming_the_file_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], seen: list[set[str]]
) -> None:
    data, store = write_sums(tmp_path / "sums.jsonl"), tmp_path / "store"
    start(capsys, store, str(data))
    record = store / "runs" / "r" / "data.json"
    record.write_text('{"task.local_files.path": {"path": 1}}')
    code, text = resume(capsys, store)
    assert code == 2 and f"damaged run record {record}: not a data record" in text
    assert "delete it: the next start records the data as it is then" in text


def test_a_fork_takes_stages_only_from_a_run_on_the_same_data(tmp_path: Path) -> None:
    data, store = write_sums(tmp_path / "sums.jsonl"), RunStore(tmp_path / "store")

    def config(run_id: str) -> Any:
        sets = [f"store.root={store.root}", f"run.run_id={run_id}", "task.name=local_files"]
        return load_config("micro", [*sets, f"task.local_files.path={data}"])

    source = config("a")
    with (
        store.open_run("a", source.model_dump(mode="json")) as run,
        run.stage(0, "warm_start") as attempt,
    ):
        attempt.write("metrics", [{"stage": "warm_start", "name": "x", "value": 1.0}])
    record_data(store, "a", data_now(source))
    target = config("b")
    shared = prefix_from(store, "a", target)
    assert shared == [("warm_start", 0)]
    fork_from(store, "a", target, shared)
    assert (store.run_dir("b") / "data.json").read_bytes() == (
        store.run_dir("a") / "data.json"
    ).read_bytes()
    write_sums(data, SUMS[:30])
    with pytest.raises(
        DataChangedError,
        match=r"run 'c' cannot take over run 'a''s stages, .* has changed since run 'a' read it",
    ):
        prefix_from(store, "a", config("c"))


def test_an_ablation_rerun_on_edited_data_is_refused_before_any_arm_runs(tmp_path: Path) -> None:
    """The shared policy_0 was trained on the data: a rerun on other data would mix the two."""
    data = write_sums(tmp_path / "sums.jsonl")
    local = ["task.name=local_files", f"task.local_files.path={data}"]
    suite = Suite(config="micro", seeds=1, overrides=local, arms={"a": [], "b": ["grpo.steps=3"]})
    plan = AblationPlan("abl", "tiny", suite, 1, tmp_path / "store")
    arms: list[str | None] = []

    def policy_0_committed(ctx: RunContext) -> Executor:
        def execute(name: str, iteration: int, fn: StageFn) -> StageResult:
            with ctx.run.stage(iteration, name) as attempt:
                attempt.write("metrics", [{"stage": name, "name": "x", "value": 1.0}])
            return StageResult(name, iteration)

        return execute

    def stopped_arm(cfg: ItergrpoConfig) -> None:
        arms.append(cfg.run.run_id)
        raise RunInterrupted("stopped in the first arm run")

    ablate = functools.partial(run_ablation, plan, make_executor=policy_0_committed)
    with pytest.raises(RunInterrupted):
        ablate(run_arm=stopped_arm)
    write_sums(data, SUMS[:30])
    with pytest.raises(DataChangedError, match=r"run 'abl' was computed on other data: task"):
        ablate(run_arm=stopped_arm)
    assert arms == ["abl-a-s0"]
