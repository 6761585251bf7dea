"""Replay sampling for continual RM training (docs/algorithm.md section 7).

The RM training set of iteration k is the new labels plus replayed history, with replayed
rows `ratio` of the mix: n_replay = round(ratio / (1 - ratio) * n_new), capped by history.
Selection is deterministic for a seed (and DuckDB version): rows are ordered by DuckDB
`hash(key..., iteration, seed)` and the first n kept (`USING SAMPLE` is repeatable only
single-threaded). Choosing reads only the key columns; the chosen rows are then fetched in
one join on a single integer row address (file index << 32 | row number in file), which
joins faster than the (file name, row number) pair.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import duckdb
import pyarrow as pa

from storage.errors import StoreError
from storage.scan import quote_ident, read_parquet_sql
from storage.schemas import TABLE_KEYS, table_schema
from storage.store import RunStore

_HASH_SPACE = 2**64


def replay_count(n_new: int, ratio: float, available: int) -> int:
    """round(ratio / (1 - ratio) * n_new) (half up), capped at `available`."""
    if not 0.0 <= ratio < 1.0:
        raise ValueError(
            f"replay ratio must be in [0, 1) (got {ratio}): it is replay / (new + replay)"
        )
    if n_new < 0 or available < 0:
        raise ValueError(f"n_new and available must be >= 0 (got {n_new}, {available})")
    wanted = math.floor(round(ratio / (1.0 - ratio) * n_new, 9) + 0.5)
    return min(wanted, available)


def _threshold(n: int, available: int, widen: int) -> int:
    """A hash bound that ~n + 6 sd rows pass (hashes are uniform); widened on a shortfall."""
    frac = (n + 6.0 * math.sqrt(n) + 16.0) / available * 4**widen
    return min(_HASH_SPACE - 1, math.ceil(frac * _HASH_SPACE))


def replay_sample(
    store: RunStore | str | Path,
    *,
    table: str,
    run_id: str,
    before_iteration: int,
    n_new: int,
    ratio: float = 0.10,
    seed: int,
    key_columns: Sequence[str] | None = None,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """Committed rows of `table` from iterations < `before_iteration`, chosen for replay.

    `key_columns` identify a row within an iteration (default: TABLE_KEYS[table]); the origin
    `iteration` is always part of the key and of the result. Rows come in hash order, so for
    one seed a larger count extends a smaller one. `columns` limits the fetched columns.
    """
    store = store if isinstance(store, RunStore) else RunStore(store)
    schema = table_schema(table)
    keys = list(key_columns) if key_columns is not None else list(TABLE_KEYS.get(table, ()))
    if not keys:
        raise StoreError(f"replay of table {table!r} needs key_columns (it has no default key)")
    out_cols = list(dict.fromkeys(["iteration", *(columns or schema.names)]))
    out_cols = [c for c in schema.names if c in out_cols]
    unknown = [c for c in [*keys, *(columns or [])] if c not in schema.names]
    if unknown:
        raise StoreError(f"column(s) {unknown} are not in table {table!r}: {schema.names}")
    replay_count(n_new, ratio, 0)  # validates ratio and n_new before touching files
    out_schema = pa.schema([schema.field(c) for c in out_cols])
    files = store.committed_files(table, run_id=run_id, iterations=range(before_iteration))
    if not files:
        return out_schema.empty_table()
    source = read_parquet_sql(files, extra_options=", file_row_number = true")
    key_sql = ", ".join(quote_ident(k) for k in [*keys, "iteration"])
    # file_index is the position in `files`; a file has far fewer than 2**32 rows.
    address = "(file_index::BIGINT << 32) | file_row_number"
    order = f"h, {key_sql}, address"
    con = duckdb.connect(":memory:")
    try:
        available = int(con.execute(f"SELECT count(*) FROM {source}").fetchall()[0][0])
        n = replay_count(n_new, ratio, available)
        if n == 0:
            return out_schema.empty_table()
        widen = 0
        while True:
            bound = _threshold(n, available, widen)
            picked = con.sql(
                f"""
                SELECT address, row_number() OVER (ORDER BY {order}) AS pick
                FROM (
                    SELECT {address} AS address, {key_sql},
                           hash({key_sql}, {int(seed)}::BIGINT) AS h
                    FROM {source}
                )
                WHERE h <= {bound}::UBIGINT
                QUALIFY pick <= {n}
                """
            ).to_arrow_table()
            if picked.num_rows == n or bound == _HASH_SPACE - 1:
                break
            widen += 1
        con.register("picked", picked)
        cols = ", ".join(f"t.{quote_ident(c)}" for c in out_cols)
        result = con.sql(
            f"""
            SELECT {cols} FROM (SELECT *, {address} AS address FROM {source}) AS t
            JOIN picked AS p ON t.address = p.address
            ORDER BY p.pick
            """
        ).to_arrow_table()
    finally:
        con.close()
    return result.cast(out_schema)
