"""Read-only SQL over the store: one DuckDB view per table over committed files only."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import duckdb
import pyarrow as pa

from storage.errors import SqlQueryError, SqlReadOnlyError
from storage.scan import RELISTS, present_columns, quote_ident, resolve_corrupt, table_select_sql
from storage.schemas import TABLE_SCHEMAS
from storage.store import RunStore

log = logging.getLogger(__name__)

# Statement types a query may have; everything else (INSERT, COPY, ATTACH, SET, ...) writes
# or changes the session.
_ALLOWED = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}
# DuckDB parses a PIVOT as MULTI (it expands to several statements); a query starting with it
# only reads, so it is allowed, still subject to the file-touching words below.
_PIVOT = re.compile(r"^\s*PIVOT\b", re.I)
# Belt and braces for statements that touch files even inside an allowed statement type.
_FORBIDDEN_WORDS = re.compile(r"\b(COPY|ATTACH|DETACH|INSTALL|LOAD|EXPORT|IMPORT)\b", re.I)
_STRING_OR_COMMENT = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|/\*.*?\*/", re.S)


def _view_sql(
    con: duckdb.DuckDBPyConnection, store: RunStore, table: str
) -> tuple[str, list[Path]]:
    files = store.committed_files(table)
    relists = 0
    while True:
        try:
            return table_select_sql(table, files, present_columns(con, files)), files
        except (duckdb.IOException, duckdb.InvalidInputException) as exc:
            if relists < RELISTS and any(not f.exists() for f in files):
                relists += 1  # a writer committed meanwhile and moved files: list them again
                files = store.committed_files(table)
            else:
                files = resolve_corrupt(files, exc, skip=True)


def view_statements(store: RunStore) -> list[str]:
    """CREATE VIEW statements for every table (paste them into the `duckdb` CLI)."""
    con = duckdb.connect(":memory:")
    try:
        return [
            f"CREATE OR REPLACE VIEW {quote_ident(t)} AS {_view_sql(con, store, t)[0]};"
            for t in TABLE_SCHEMAS
        ]
    finally:
        con.close()


def create_views(con: duckdb.DuckDBPyConnection, store: RunStore) -> list[str]:
    """Create one view per table on `con`; returns the committed files the views read."""
    all_files: list[str] = []
    for table in TABLE_SCHEMAS:
        select, files = _view_sql(con, store, table)
        con.execute(f"CREATE OR REPLACE VIEW {quote_ident(table)} AS {select}")
        all_files.extend(str(f) for f in files)
    return all_files


def read_only_connection(store: RunStore) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the views, allowed to read the views' files only."""
    con = duckdb.connect(":memory:")
    files = create_views(con, store)
    con.execute("SET allowed_paths = " + "[" + ", ".join(_lit(f) for f in files) + "]")
    con.execute("SET enable_external_access = false")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET lock_configuration = true")
    return con


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def check_read_only(sql: str) -> None:
    """Raise SqlReadOnlyError unless every statement in `sql` is a query (SELECT/EXPLAIN)."""
    statements = duckdb.extract_statements(sql)
    if not statements:
        raise SqlReadOnlyError("empty SQL: give a SELECT query")
    for st in statements:
        pivot = st.type == duckdb.StatementType.MULTI and _PIVOT.match(st.query)
        if st.type not in _ALLOWED and not pivot:
            kind = st.type.name.replace("_", " ")
            raise SqlReadOnlyError(
                f"{kind} statements are not allowed: the store is read-only from SQL "
                f"(only SELECT queries; export with --format/--output). Statement: {st.query!r:.80}"
            )
        bare = _STRING_OR_COMMENT.sub(" ", st.query)
        word = _FORBIDDEN_WORDS.search(bare)
        if word:
            raise SqlReadOnlyError(
                f"{word.group(1).upper()} is not allowed: the store is read-only from SQL"
            )


def run_query(store: RunStore, sql: str) -> pa.Table:
    """Run a read-only query against the store's views and return the result of the last one."""
    try:
        check_read_only(sql)
    except duckdb.Error as exc:
        raise SqlQueryError(f"the query cannot be parsed: {exc}") from exc
    con = read_only_connection(store)
    try:
        statements = duckdb.extract_statements(sql)
        for st in statements[:-1]:
            con.execute(st.query).fetchall()
        return con.sql(statements[-1].query).to_arrow_table()
    except duckdb.Error as exc:  # the user's SQL: an unknown column, a type mismatch, ...
        raise SqlQueryError(f"the query failed: {exc}") from exc
    finally:
        con.close()
