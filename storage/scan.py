"""DuckDB SQL text that reads a table from an explicit list of committed Parquet files.

Shared by the Python reader, the SQL views and replay so all three see the same rows with
the same types: partition columns from the path, columns missing from older files as NULL,
and an empty table as a typed empty relation.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import duckdb
import pyarrow.parquet as pq

from storage.errors import CorruptFileError
from storage.schemas import LEGACY_COLUMNS, PARTITION_COLUMNS, duckdb_type, table_schema

log = logging.getLogger(__name__)

# Times a reader lists a table's committed files again when some of those it listed are gone
# (a commit meanwhile moved them: into tables/, or a superseded attempt's out).
RELISTS = 3


def quote_literal(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def quote_ident(name: str) -> str:
    """A SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def read_parquet_sql(files: Sequence[Path], *, extra_options: str = "") -> str:
    """`read_parquet([...])` over `files` with hive partition columns typed as in the schemas."""
    file_list = ", ".join(quote_literal(str(f)) for f in files)
    return (
        f"read_parquet([{file_list}], hive_partitioning = true, union_by_name = true, "
        f"hive_types = {{'run_id': VARCHAR, 'iteration': BIGINT}}{extra_options})"
    )


def empty_select_sql(table: str) -> str:
    """A typed, empty SELECT with the columns of `table`."""
    cols = ", ".join(
        f"CAST(NULL AS {duckdb_type(f.type)}) AS {quote_ident(f.name)}" for f in table_schema(table)
    )
    return f"SELECT {cols} WHERE false"


def table_select_sql(table: str, files: Sequence[Path], present: set[str]) -> str:
    """SELECT of all schema columns of `table` from `files`: a column not in `present` as
    NULL, or read from older files' columns where LEGACY_COLUMNS says how."""
    if not files:
        return empty_select_sql(table)
    cols = []
    for field in table_schema(table):
        ident = quote_ident(field.name)
        legacy = LEGACY_COLUMNS.get(table, {}).get(field.name)
        if legacy is not None and set(legacy.sources) <= present:
            fresh = ident if field.name in present else "NULL"
            cols.append(f"COALESCE({fresh}, {legacy.sql}) AS {ident}")
        elif field.name in present or field.name in PARTITION_COLUMNS:
            cols.append(ident)
        else:
            cols.append(f"CAST(NULL AS {duckdb_type(field.type)}) AS {ident}")
    return f"SELECT {', '.join(cols)} FROM {read_parquet_sql(files)}"


def present_columns(con: duckdb.DuckDBPyConnection, files: Sequence[Path]) -> set[str]:
    """The union of the column names in `files` (reads only the footers)."""
    if not files:
        return set()
    rows = con.execute(f"DESCRIBE SELECT * FROM {read_parquet_sql(files)}").fetchall()
    return {str(r[0]) for r in rows}


def find_corrupt(files: Sequence[Path], message: str = "") -> list[Path]:
    """The files among `files` that cannot be read (the one named in `message` is tried first)."""
    named = [f for f in files if str(f) in message]
    bad = []
    for f in [*named, *(f for f in files if f not in named)]:
        try:
            pq.ParquetFile(f).read()
        except Exception:
            bad.append(f)
            if f in named:
                break
    return bad


def resolve_corrupt(files: Sequence[Path], error: duckdb.Error, *, skip: bool) -> list[Path]:
    """After a DuckDB error: the readable files, or CorruptFileError for the first bad one.

    With `skip` the bad files are dropped with a warning listing them; otherwise the first bad
    file raises CorruptFileError. Re-raises `error` if every file reads fine.
    """
    bad = find_corrupt(files, str(error))
    if not bad:
        raise error
    if not skip:
        raise CorruptFileError(bad[0], str(error).splitlines()[0]) from error
    log.warning(
        "skipping %d corrupt Parquet file(s) in the store: %s",
        len(bad),
        ", ".join(str(b) for b in bad),
    )
    return [f for f in files if f not in bad]
