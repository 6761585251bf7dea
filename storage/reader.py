"""The store from Python (a notebook): `open_store` gives read-only SQL over the views
`itergrpo sql` uses (committed rows only) as DuckDB relations, pandas or Arrow, the run list,
and a table by run."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from storage.errors import SqlQueryError, StoreError
from storage.scan import quote_ident, quote_literal
from storage.schemas import TABLE_SCHEMAS, table_schema
from storage.sql import check_read_only, read_only_connection
from storage.store import RunStore

if TYPE_CHECKING:
    import pandas as pd

# The columns `runs()` puts first; any other field a run's status holds follows them.
RUN_COLUMNS = ("run_id", "status", "iterations_done", "created_at", "updated_at")


def open_store(root: str | Path | None = None) -> StoreReader:
    """The store at `root` (None: $ITERGRPO_STORE, then ./itergrpo-store, as the CLI finds
    it), read-only; StoreError when nothing is stored there."""
    return StoreReader(RunStore(root).require_existing())


class StoreReader:
    """Read-only SQL over a store's committed rows, as of when it was opened (`refresh()`
    sees commits made since). Use as a context manager, or `close()` it."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self._con: duckdb.DuckDBPyConnection | None = read_only_connection(store)

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"open_store({str(self.store.root)!r})"

    @property
    def root(self) -> Path:
        return self.store.root

    @property
    def tables(self) -> list[str]:
        """The table (view) names a query may read."""
        return list(TABLE_SCHEMAS)

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None

    def refresh(self) -> None:
        """Views over what is committed now (a run may have committed stages since)."""
        self.close()
        self._con = read_only_connection(self.store)

    def _connection(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            raise StoreError(f"the store reader of {self.store.root} is closed")
        return self._con

    def sql(self, query: str) -> duckdb.DuckDBPyRelation:
        """A read-only query (SELECT, EXPLAIN) over the views: a DuckDB relation (`.df()`,
        `.to_arrow_table()`, `.pl()`, or query it further). SqlReadOnlyError for any other
        statement."""
        try:
            check_read_only(query)
            return self._connection().sql(query)
        except duckdb.Error as exc:  # the user's SQL: an unknown column, a type mismatch, ...
            raise SqlQueryError(f"the query failed: {exc}") from exc

    def df(self, query: str) -> pd.DataFrame:
        """`sql(query)` as a pandas DataFrame."""
        return self.sql(query).df()

    def arrow(self, query: str) -> pa.Table:
        """`sql(query)` as an Arrow table."""
        return self.sql(query).to_arrow_table()

    def runs(self) -> pd.DataFrame:
        """One row per run: run_id, status, iterations_done, created_at, updated_at, then what
        else its status records (failure, forked_from, ...); as `itergrpo runs` lists them."""
        import pandas as pd

        rows = self.store.runs()
        extra = sorted({key for row in rows for key in row} - set(RUN_COLUMNS))
        return pd.DataFrame(rows, columns=[*RUN_COLUMNS, *extra])

    def config(self, run_id: str) -> dict[str, Any]:
        """The config `run_id` was started with (runs/<run_id>/config.yaml)."""
        return self.store.run_config(run_id)

    def table(
        self, name: str, run_id: str | None = None, iterations: Iterable[int] | None = None
    ) -> duckdb.DuckDBPyRelation:
        """The committed rows of table `name` (of run `run_id` and `iterations`, when given):
        the view `itergrpo sql` reads, as a relation."""
        table_schema(name)  # an unknown table is refused, naming the tables
        conditions = []
        if run_id is not None:
            if run_id not in self.store.run_ids():
                raise StoreError(
                    f"no run {run_id!r} in store {self.store.root}; its runs: "
                    f"{', '.join(self.store.run_ids()) or 'none'}"
                )
            conditions.append(f"run_id = {quote_literal(run_id)}")
        if iterations is not None:
            wanted = sorted({int(i) for i in iterations})
            conditions.append(f"iteration IN ({', '.join(map(str, wanted)) or 'NULL'})")
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        return self._connection().sql(f"SELECT * FROM {quote_ident(name)}{where}")
