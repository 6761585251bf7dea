"""`itergrpo export`: a run's committed rows of rollouts, labels or policy samples as Parquet,
JSON lines or a Hugging Face `datasets` folder, and the mistakes it refuses."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from flows.cli import main
from storage.store import RunStore

SAMPLE = {
    "step": 0,
    "problem_id": "p",
    "sample_index": 0,
    "completion": "1 + 1 = 2",
    "reward": 1.0,
    "reward_parts": {"verifier": 1.0, "orm": 0.25},
    "advantage": 0.5,
    "kl": 0.0,
    "ratio_mean": 1.0,
    "ratio_max": 1.0,
    "n_completion_tokens": 5,
    "correct": True,
    "truncated": False,
}


@pytest.fixture
def store(tmp_path: Path) -> RunStore:
    """Run r: ORM labels and policy samples of iteration 0, PRM labels never committed; run
    other: ORM labels."""
    store = RunStore(tmp_path / "store")
    orm = [{"problem_id": f"p{i}", "sample_index": i, "label": i % 2} for i in range(3)]
    with store.open_run("r", {}) as run:
        with run.stage(0, "label") as attempt:
            attempt.write("orm_labels", orm)
        with run.stage(0, "grpo") as attempt:
            attempt.write("policy_samples", [SAMPLE, {**SAMPLE, "sample_index": 1}])
        unfinished = run.stage(1, "label")
        unfinished.begin()
        unfinished.write("orm_labels", orm)
    with store.open_run("other", {}) as run, run.stage(0, "label") as attempt:
        attempt.write("orm_labels", orm[:1])
    return store


def export(store: RunStore, *args: str) -> int:
    return main(["export", "--store", str(store.root), *args])


def test_labels_as_parquet_hold_the_runs_committed_rows(
    store: RunStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert export(store, "--run", "r", "--table", "labels", "--out", str(out)) == 0
    assert sorted(p.name for p in out.iterdir()) == ["orm_labels.parquet", "prm_labels.parquet"]
    orm = pq.read_table(out / "orm_labels.parquet")
    assert orm.column("problem_id").to_pylist() == ["p0", "p1", "p2"]
    assert set(orm.column("run_id").to_pylist()) == {"r"}
    assert pq.read_table(out / "prm_labels.parquet").num_rows == 0
    assert "exported 3 orm_labels rows, 0 prm_labels rows of run r" in capsys.readouterr().out


def test_policy_samples_as_jsonl_keep_reward_parts_by_name(store: RunStore, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ("--run", "r", "--table", "policy_samples", "--format", "jsonl", "--out", str(out))
    assert export(store, *args) == 0
    rows = [json.loads(line) for line in (out / "policy_samples.jsonl").read_text().splitlines()]
    assert [r["sample_index"] for r in rows] == [0, 1]
    assert rows[0]["reward_parts"] == {"verifier": 1.0, "orm": 0.25}
    assert rows[0]["completion"] == "1 + 1 = 2" and rows[0]["iteration"] == 0


def test_a_hugging_face_datasets_folder_loads_with_load_from_disk(
    store: RunStore, tmp_path: Path
) -> None:
    datasets = pytest.importorskip("datasets")
    samples, labels = tmp_path / "samples", tmp_path / "labels"
    assert (
        export(
            store,
            "--run",
            "r",
            "--table",
            "policy_samples",
            "--format",
            "hf",
            "--out",
            str(samples),
        )
        == 0
    )
    assert (
        export(store, "--run", "r", "--table", "labels", "--format", "hf", "--out", str(labels))
        == 0
    )
    loaded = datasets.load_from_disk(str(samples))
    assert loaded.num_rows == 2 and loaded[0]["completion"] == "1 + 1 = 2"
    parts = {p["key"]: p["value"] for p in loaded[0]["reward_parts"]}
    assert parts == {"verifier": 1.0, "orm": 0.25}
    both = datasets.load_from_disk(str(labels))
    assert {name: d.num_rows for name, d in both.items()} == {"orm_labels": 3, "prm_labels": 0}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--run", "nope", "--table", "rollouts"), "no run 'nope' in store .*its runs: other, r"),
        (("--run", "r", "--table", "rollouts"), "run 'r' has no committed rows in rollouts"),
    ],
)
def test_mistakes_are_one_line_errors_and_write_nothing(
    store: RunStore,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: tuple[str, ...],
    message: str,
) -> None:
    out = tmp_path / "out"
    assert export(store, *args, "--out", str(out)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert re.search(message, err), err
    assert not out.exists()


def test_an_existing_folder_is_not_overwritten(
    store: RunStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    assert export(store, "--run", "r", "--table", "labels", "--out", str(out)) == 2
    assert "exists: give a new folder" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
