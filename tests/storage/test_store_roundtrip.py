"""Property test: any valid rows of any table written in a stage read back equal."""

from __future__ import annotations

import datetime as dt
import tempfile
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.schemas import PARTITION_COLUMNS, TABLE_SCHEMAS, file_schema
from storage.store import RunStore

_INT_BOUNDS = {8: 2**7, 32: 2**31, 64: 2**63}


def value_strategy(field: pa.Field) -> st.SearchStrategy[Any]:
    t = field.type
    if pa.types.is_string(t):
        base: st.SearchStrategy[Any] = st.text(max_size=30)
    elif pa.types.is_integer(t):
        bound = _INT_BOUNDS[t.bit_width]
        base = st.integers(-bound, bound - 1)
    elif pa.types.is_floating(t):
        base = st.floats(allow_nan=False, allow_infinity=False, width=64)
    elif pa.types.is_boolean(t):
        base = st.booleans()
    elif pa.types.is_map(t):  # reward parts by name
        finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
        base = st.dictionaries(st.text(max_size=10), finite, max_size=4)
    elif pa.types.is_timestamp(t):
        base = st.datetimes(
            min_value=dt.datetime(1970, 1, 1),
            max_value=dt.datetime(2200, 1, 1),
            timezones=st.just(dt.UTC),
        )
    else:
        raise AssertionError(f"no strategy for {t}")
    return st.none() | base if field.nullable else base


def rows_strategy(table: str) -> st.SearchStrategy[list[dict[str, Any]]]:
    fields = {f.name: value_strategy(f) for f in file_schema(table)}
    return st.lists(st.fixed_dictionaries(fields), min_size=0, max_size=8)


data_tables = [t for t in TABLE_SCHEMAS if t != "stages"]


@settings(max_examples=25)
@given(
    table=st.sampled_from(data_tables),
    data=st.data(),
    iteration=st.integers(0, 3),
)
def test_rows_round_trip(table: str, data: st.DataObject, iteration: int) -> None:
    rows = data.draw(rows_strategy(table))
    with tempfile.TemporaryDirectory() as root:
        store = RunStore(root)
        with store.open_run("run-1.a", {}) as run, run.stage(iteration, "s") as attempt:
            attempt.write(table, rows)
        back = store.read(table)
    assert back.schema == TABLE_SCHEMAS[table]
    expected = [{"run_id": "run-1.a", "iteration": iteration, **r} for r in rows]
    got = [{k: as_written(v) for k, v in r.items()} for r in back.to_pylist()]
    assert [{k: r[k] for k in r if k not in PARTITION_COLUMNS} for r in got] == rows
    assert got == [{f: e[f] for f in TABLE_SCHEMAS[table].names} for e in expected]


def as_written(value: Any) -> Any:
    """A map column reads back as Arrow gives it, (key, value) pairs in order: a dict again."""
    is_pairs = isinstance(value, list) and all(isinstance(x, tuple) for x in value)
    return dict(value) if is_pairs else value
