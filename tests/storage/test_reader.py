"""The store from Python (storage/reader.py): SQL as relations, pandas and Arrow over the
committed rows, the run list, a table by run, and nothing that writes."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pytest

from storage import open_store
from storage.errors import SqlQueryError, SqlReadOnlyError, StoreError, UnknownTableError
from storage.store import RunStore


def orm_rows(n: int, start: int = 0) -> list[dict[str, object]]:
    return [
        {"problem_id": f"p{i}", "sample_index": i % 4, "label": i % 2}
        for i in range(start, start + n)
    ]


@pytest.fixture
def two_runs(tmp_path: Path) -> RunStore:
    """Run a: labels of iterations 0 and 1, and an unfinished attempt; run b: iteration 0."""
    store = RunStore(tmp_path)
    with store.open_run("a", {"seed": 1}) as run:
        for k, n in ((0, 3), (1, 2)):
            with run.stage(k, "label") as attempt:
                attempt.write("orm_labels", orm_rows(n))
        unfinished = run.stage(2, "label")
        unfinished.begin()
        unfinished.write("orm_labels", orm_rows(7))
        run.set_status("running", iterations_done=2)
    with store.open_run("b", {"seed": 2}) as run, run.stage(0, "label") as attempt:
        attempt.write("orm_labels", orm_rows(4))
    return store


def test_sql_gives_relations_pandas_and_arrow_of_the_committed_rows(two_runs: RunStore) -> None:
    query = "SELECT run_id, iteration, count(*) AS n FROM orm_labels GROUP BY ALL ORDER BY ALL"
    with open_store(two_runs.root) as store:
        relation = store.sql(query)
        assert isinstance(relation, duckdb.DuckDBPyRelation)
        assert relation.fetchall() == [("a", 0, 3), ("a", 1, 2), ("b", 0, 4)]
        frame = store.df(query)
        assert isinstance(frame, pd.DataFrame) and frame["n"].tolist() == [3, 2, 4]
        table = store.arrow(query)
        assert isinstance(table, pa.Table) and table.column("n").to_pylist() == [3, 2, 4]
        # the same rows `itergrpo sql` shows (its views), typed as the schemas say
        assert store.sql("SELECT label FROM orm_labels").types == ["TINYINT"]


def test_a_table_by_run_and_iterations(two_runs: RunStore) -> None:
    with open_store(two_runs.root) as store:
        assert store.table("orm_labels", run_id="a").count("*").fetchall() == [(5,)]
        assert len(store.table("orm_labels", run_id="a", iterations=[1]).df()) == 2
        assert len(store.table("orm_labels").df()) == 9
        assert store.table("orm_labels").columns[:2] == ["run_id", "iteration"]
        with pytest.raises(StoreError, match=r"no run .c. in store .*its runs: a, b"):
            store.table("orm_labels", run_id="c")
        with pytest.raises(UnknownTableError, match="unknown table 'labels'"):
            store.table("labels")


def test_the_run_list_and_a_runs_config(two_runs: RunStore) -> None:
    with open_store(two_runs.root) as store:
        runs = store.runs()
        assert runs.columns[:3].tolist() == ["run_id", "status", "iterations_done"]
        assert runs["run_id"].tolist() == ["a", "b"]
        assert runs.set_index("run_id").loc["a", "iterations_done"] == 2
        assert store.config("b") == {"seed": 2}


def test_nothing_writes_through_the_reader(two_runs: RunStore, tmp_path: Path) -> None:
    with open_store(two_runs.root) as store:
        with pytest.raises(SqlReadOnlyError, match="read-only"):
            store.sql("DELETE FROM orm_labels")
        with pytest.raises(SqlReadOnlyError, match="COPY"):
            store.sql(f"COPY (SELECT 1) TO '{tmp_path / 'x.csv'}'")
        with pytest.raises(SqlQueryError, match="nope"):
            store.sql("SELECT nope FROM orm_labels")
    assert not (tmp_path / "x.csv").exists()


def test_refresh_sees_what_was_committed_since(two_runs: RunStore) -> None:
    store = open_store(two_runs.root)
    with two_runs.open_run("b", {"seed": 2}) as run, run.stage(1, "label") as attempt:
        attempt.write("orm_labels", orm_rows(1))
    assert store.table("orm_labels", run_id="b").count("*").fetchall() == [(4,)]
    store.refresh()
    assert store.table("orm_labels", run_id="b").count("*").fetchall() == [(5,)]
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.sql("SELECT 1")


def test_a_folder_without_a_store_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no itergrpo store at"):
        open_store(tmp_path / "typo")
