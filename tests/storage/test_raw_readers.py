"""Readers that open the Parquet tree directly (pyarrow's dataset reader, DuckDB's
read_parquet, pandas) see the committed rows only: uncommitted and superseded attempts live
outside tables/ (storage/attempts.py)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow.dataset as ds
import pytest

import storage.run_writer
import storage.scan
import storage.sql
import storage.store
from storage.sql import run_query
from storage.store import RunStore
from tests.flow_helpers import REPO


def raw_counts(root: Path, table: str) -> dict[str, int]:
    """The rows of `table` each raw reader finds under the store's tables/ folder."""
    folder = root / "tables" / table
    pattern = str(folder / "**" / "*.parquet")
    return {
        "pyarrow": ds.dataset(folder, format="parquet", partitioning="hive").count_rows(),
        "duckdb": duckdb.sql(
            f"SELECT count(*) FROM read_parquet('{pattern}', hive_partitioning = true, "
            "union_by_name = true)"
        ).fetchall()[0][0],
        "pandas": len(pd.read_parquet(folder)),
    }


def orm_rows(n: int, start: int = 0) -> list[dict[str, object]]:
    return [
        {"problem_id": f"p{i}", "sample_index": i % 4, "label": i % 2}
        for i in range(start, start + n)
    ]


def ablation_rows(seeds: int) -> list[dict[str, object]]:
    """An `ablation` table of two arms x `seeds` seeds x three metrics."""
    return [
        {
            "ablation_id": "abl",
            "arm": arm,
            "seed": seed,
            "policy_iteration": 1,
            "metric": metric,
            "k": None,
            "value": 0.5,
            "arm_run_id": f"abl-{arm}-s{seed}",
        }
        for arm in ("a", "b")
        for seed in range(seeds)
        for metric in ("greedy_acc", "maj@k", "pass@k")
    ]


KILLED_WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from storage.store import RunStore
    rows = lambda n, s=0: [
        {"problem_id": f"p{i}", "sample_index": i % 4, "label": i % 2} for i in range(s, s + n)
    ]
    with RunStore(sys.argv[1]).open_run("r1", {}) as run:
        with run.stage(0, "label") as attempt:
            attempt.write("orm_labels", rows(3))
        attempt = run.stage(1, "label")
        attempt.begin()
        attempt.write("orm_labels", rows(5))
        attempt.write("orm_labels", rows(4, 5))
        os.kill(os.getpid(), signal.SIGKILL)  # between the stage's writes and its commit
    """
)


def test_a_store_killed_between_a_stages_writes_and_its_commit_shows_committed_rows_only(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(tmp_path)], env=env, capture_output=True
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    store = RunStore(tmp_path)
    assert store.read("orm_labels").num_rows == 3
    assert raw_counts(tmp_path, "orm_labels") == {"pyarrow": 3, "duckdb": 3, "pandas": 3}
    assert raw_counts(tmp_path, "stages") == {"pyarrow": 1, "duckdb": 1, "pandas": 1}
    # the killed attempt's 9 rows are kept, outside the tree readers open
    kept = tmp_path / "attempts" / "uncommitted" / "orm_labels"
    assert ds.dataset(kept, format="parquet", partitioning="hive").count_rows() == 9

    with store.open_run("r1", {}) as run, run.stage(1, "label") as attempt:  # the resume
        attempt.write("orm_labels", orm_rows(2))
    assert raw_counts(tmp_path, "orm_labels") == {"pyarrow": 5, "duckdb": 5, "pandas": 5}
    assert store.read("orm_labels").num_rows == 5
    assert not list(kept.rglob("*.parquet"))  # the rerun removed the killed attempt's files


def test_an_ablation_whose_seeds_were_extended_shows_raw_readers_the_new_table_only(
    tmp_path: Path,
) -> None:
    store = RunStore(tmp_path)
    with store.open_run("abl", {}) as record:
        with record.stage(0, "ablation") as attempt:  # two seeds
            attempt.write("ablation", ablation_rows(2))
        # as flows/ablate/run.py adds a third seed: the new table supersedes the committed one
        with record.stage(0, "ablation", supersede=True) as attempt:
            attempt.write("ablation", ablation_rows(3))
    assert store.read("ablation").num_rows == 18
    assert raw_counts(tmp_path, "ablation") == {"pyarrow": 18, "duckdb": 18, "pandas": 18}
    assert raw_counts(tmp_path, "stages") == {"pyarrow": 1, "duckdb": 1, "pandas": 1}
    # the superseded table and its commit record are kept beside the tree readers open
    old = tmp_path / "attempts" / "superseded"
    assert ds.dataset(old / "ablation", format="parquet", partitioning="hive").count_rows() == 12
    assert [p.name for p in (old / "stages").rglob("*.parquet")] == ["ablation-1.parquet"]


def test_a_commit_cut_short_before_its_files_moved_reads_whole_and_the_next_writer_finishes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RunStore(tmp_path)
    with store.open_run("r1", {}) as run:
        with run.stage(0, "rollout") as attempt:
            attempt.write("orm_labels", orm_rows(1))
        with monkeypatch.context() as patch:  # killed right after the commit record
            patch.setattr(storage.run_writer, "publish", lambda *args: None)
            with run.stage(0, "label") as attempt:
                attempt.write("orm_labels", orm_rows(2, 1))
    assert store.read("orm_labels").num_rows == 3  # the commit record decides
    assert raw_counts(tmp_path, "orm_labels")["pyarrow"] == 1
    store.open_run("r1", {}).close()  # the run's next writer (a resume) finishes the move
    assert raw_counts(tmp_path, "orm_labels") == {"pyarrow": 3, "duckdb": 3, "pandas": 3}
    assert store.read("orm_labels").num_rows == 3


def test_a_store_of_an_earlier_version_reads_the_same_and_its_next_writer_tidies_it(
    tmp_path: Path,
) -> None:
    store = RunStore(tmp_path)
    with store.open_run("r1", {}) as run:
        with run.stage(0, "label") as attempt:
            attempt.write("orm_labels", orm_rows(2))
        with run.stage(0, "label", supersede=True) as attempt:
            attempt.write("orm_labels", orm_rows(3))
        unfinished = run.stage(1, "label")
        unfinished.begin()
        unfinished.write("orm_labels", orm_rows(4))
    # Earlier versions kept every attempt's files in tables/: move them back there.
    for area in ("uncommitted", "superseded"):
        for path in sorted((tmp_path / "attempts" / area).rglob("*.parquet")):
            dst = tmp_path / "tables" / path.relative_to(tmp_path / "attempts" / area)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(path, dst)
    assert raw_counts(tmp_path, "orm_labels")["pyarrow"] == 9
    assert store.read("orm_labels").num_rows == 3
    assert len(store.committed_stages("r1")) == 1

    store.open_run("r1", {}).close()  # e.g. a resume
    assert raw_counts(tmp_path, "orm_labels") == {"pyarrow": 3, "duckdb": 3, "pandas": 3}
    assert raw_counts(tmp_path, "stages")["duckdb"] == 1
    assert store.read("orm_labels").num_rows == 3
    with store.open_run("r1", {}) as run, run.stage(1, "label") as attempt:
        assert attempt.attempt == 2  # numbered after the moved-out attempt, as before
        attempt.write("orm_labels", orm_rows(1))
    assert store.read("orm_labels").num_rows == 4


@pytest.mark.parametrize("reader", ["read", "sql"])
def test_a_read_while_a_commit_moves_its_files_lists_them_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reader: str
) -> None:
    store = RunStore(tmp_path)
    with store.open_run("abl", {}) as record:
        with record.stage(0, "ablation") as attempt:
            attempt.write("ablation", ablation_rows(2))
        real = storage.scan.present_columns
        moves = []

        def superseded_meanwhile(con: duckdb.DuckDBPyConnection, files: list[Path]) -> set[str]:
            """The reader has listed the table's files; a superseding commit moves them before
            it reads them (once)."""
            if files and not moves:
                with record.stage(0, "ablation", supersede=True) as attempt:
                    attempt.write("ablation", ablation_rows(3))
                moves.append(files)
            return real(con, files)

        monkeypatch.setattr(storage.store, "present_columns", superseded_meanwhile)
        monkeypatch.setattr(storage.sql, "present_columns", superseded_meanwhile)
        if reader == "read":
            rows = store.read("ablation").num_rows
        else:
            rows = run_query(store, "SELECT count(*) AS n FROM ablation").column("n")[0].as_py()
    assert moves and not moves[0][0].exists()  # the listed file had moved
    assert rows == 18
