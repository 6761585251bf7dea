"""SQL over the store: views over committed files only, read-only, CLI output and exit codes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import duckdb
import pytest

from flows.cli import main
from storage.errors import SqlQueryError, SqlReadOnlyError
from storage.schemas import TABLE_SCHEMAS
from storage.sql import create_views, run_query, view_statements
from storage.store import RunStore


@pytest.fixture
def store(tmp_path: Path) -> RunStore:
    """Iteration 0 committed (3 eval rows), iteration 1 written but never committed."""
    store = RunStore(tmp_path / "store")
    rows = [
        {"policy_iteration": 1, "split": "test", "metric": m, "k": k, "value": v, "n": 50}
        for m, k, v in [("greedy_acc", None, 0.25), ("pass@4", 4, 0.5), ("maj@4", 4, 0.375)]
    ]
    with store.open_run("r1", {}) as run:
        with run.stage(0, "evaluate") as a:
            a.write("eval", rows)
        with pytest.raises(RuntimeError), run.stage(1, "evaluate") as a:
            a.write("eval", rows)
            raise RuntimeError
    return store


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_views_see_only_committed_files(store: RunStore) -> None:
    t = run_query(store, "SELECT iteration, metric, k, value FROM eval ORDER BY value")
    assert t.column("iteration").to_pylist() == [0, 0, 0]
    assert t.column("value").to_pylist() == [0.25, 0.375, 0.5]
    assert t.column("k").to_pylist() == [None, 4, 4]


def test_empty_table_has_a_typed_view(store: RunStore) -> None:
    t = run_query(store, "SELECT * FROM rollouts")
    assert t.num_rows == 0
    assert "completion" in t.column_names and str(t.schema.field("correct").type) == "bool"


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO eval SELECT * FROM eval",
        "COPY (SELECT 1 AS a) TO '{root}/tables/eval/x.parquet' (FORMAT parquet)",
        "COPY eval TO '{root}/out.csv'",
        "ATTACH '{root}/x.duckdb' AS x",
        "CREATE TABLE t AS SELECT 1",
        "DELETE FROM eval",
        "UPDATE eval SET value = 1",
        "DROP VIEW eval",
        "SET enable_external_access = true",
        "SELECT 1; INSTALL httpfs",
        "SELECT 1; EXPORT DATABASE '{root}/dump'",
    ],
)
def test_writing_statements_are_refused_and_files_unchanged(store: RunStore, sql: str) -> None:
    before = snapshot(store.root)
    with pytest.raises(SqlReadOnlyError, match="not allowed"):
        run_query(store, sql.format(root=store.root))
    assert snapshot(store.root) == before


def test_reading_files_outside_the_store_is_refused(store: RunStore, tmp_path: Path) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    with pytest.raises(SqlQueryError, match="disabled by configuration") as refused:
        run_query(store, f"SELECT * FROM read_csv('{secret}')")
    assert isinstance(refused.value.__cause__, duckdb.Error)


def test_syntax_error_surfaces_duckdbs_message(store: RunStore) -> None:
    with pytest.raises(SqlQueryError, match="syntax error") as refused:
        run_query(store, "SELEC * FROM eval")
    assert isinstance(refused.value.__cause__, duckdb.ParserException)


def test_view_statements_work_in_a_fresh_duckdb(store: RunStore) -> None:
    con = duckdb.connect()
    for stmt in view_statements(store):
        con.execute(stmt)
    assert con.execute("SELECT count(*) FROM eval").fetchall() == [(3,)]
    con2 = duckdb.connect()
    create_views(con2, store)
    assert con2.execute("SELECT count(*) FROM stages").fetchall() == [(1,)]


def test_corrupt_file_is_skipped_with_a_warning(
    store: RunStore, caplog: pytest.LogCaptureFixture
) -> None:
    bad = store.committed_files("eval")[0]
    bad.write_bytes(b"not parquet")
    t = run_query(store, "SELECT count(*) AS n FROM stages")
    assert t.column("n").to_pylist() == [1]
    assert str(bad) in caplog.text


def test_cli_sql_formats_and_exit_codes(
    store: RunStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = str(store.root)
    assert main(["sql", "SELECT metric, value FROM eval ORDER BY value", "--store", s]) == 0
    out = capsys.readouterr().out
    assert "greedy_acc" in out and "(3 rows)" in out
    assert (
        main(["sql", "SELECT metric FROM eval ORDER BY 1", "--store", s, "--format", "json"]) == 0
    )
    assert [r["metric"] for r in json.loads(capsys.readouterr().out)] == [
        "greedy_acc",
        "maj@4",
        "pass@4",
    ]
    csv_path = tmp_path / "out.csv"
    assert (
        main(["sql", "SELECT k FROM eval", "--store", s, "--format", "csv", "-o", str(csv_path)])
        == 0
    )
    assert csv_path.read_text().splitlines()[0] == '"k"'
    assert main(["sql", "SELEC 1", "--store", s]) == 2
    assert "syntax error" in capsys.readouterr().err
    assert main(["sql", "DELETE FROM eval", "--store", s]) == 2
    assert "read-only" in capsys.readouterr().err
    assert main(["sql", "--print-views", "--store", s]) == 0
    assert capsys.readouterr().out.count("CREATE OR REPLACE VIEW") == len(TABLE_SCHEMAS)


def test_cli_tables_and_runs(store: RunStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tables", "--store", str(store.root)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "3 rows" in lines["eval"] and "0 rows" in lines["rollouts"]
    assert main(["runs", "--store", str(store.root)]) == 0
    assert "r1" in capsys.readouterr().out


def test_cli_store_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["runs", "--store", str(f)]) == 2
    assert "is a file" in capsys.readouterr().err


def test_pivot_is_a_read_only_query(store: RunStore) -> None:
    t = run_query(store, "PIVOT (SELECT metric, value FROM eval) ON metric USING max(value)")
    assert sorted(t.column_names) == ["greedy_acc", "maj@4", "pass@4"]
    with pytest.raises(SqlReadOnlyError):
        run_query(store, "PIVOT (SELECT metric FROM eval) ON metric; COPY eval TO 'x.csv'")


@pytest.mark.parametrize("command", [["sql", "SELECT 1"], ["tables"], ["runs"], ["report", "r1"]])
def test_a_missing_store_is_an_error_not_an_empty_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    missing = tmp_path / "typo"
    assert main([*command, "--store", str(missing)]) == 2
    assert f"no itergrpo store at {missing}" in capsys.readouterr().err
    assert not missing.exists()


def test_report_of_an_unknown_run_and_the_sql_hint(
    store: RunStore, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", "nope", "--store", str(store.root)]) == 2
    assert "no run 'nope'" in capsys.readouterr().err
    assert not (store.root / "reports" / "nope").exists()
    assert main(["sql", "--store", str(store.root)]) == 2
    hint = capsys.readouterr().err
    assert "SELECT * FROM eval LIMIT 10" in hint and "rollouts" in hint
