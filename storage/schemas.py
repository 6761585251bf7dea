"""The Arrow schema of every store table (the names are the SQL names users type).

`run_id` and `iteration` are hive partition columns: they live in the path
(`run_id=<id>/iteration=<k>/`), not in the Parquet files; readers add them back.
New columns must be nullable so older files stay readable with `union_by_name`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from storage.errors import NonFiniteValueError, SchemaMismatchError, UnknownTableError

PARTITION_COLUMNS: tuple[str, ...] = ("run_id", "iteration")

_PARTITION_FIELDS = [
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("iteration", pa.int64(), nullable=False),
]


def _req(name: str, typ: pa.DataType) -> pa.Field:
    return pa.field(name, typ, nullable=False)


def _opt(name: str, typ: pa.DataType) -> pa.Field:
    return pa.field(name, typ, nullable=True)


def _schema(*fields: pa.Field) -> pa.Schema:
    return pa.schema([*_PARTITION_FIELDS, *fields])


_S = pa.string()
_I64 = pa.int64()
_I32 = pa.int32()
_I8 = pa.int8()
_F64 = pa.float64()
_BOOL = pa.bool_()
_TS = pa.timestamp("us", tz="UTC")
_PARTS = pa.map_(pa.string(), pa.float64())

TABLE_SCHEMAS: dict[str, pa.Schema] = {
    "prompts": _schema(
        _req("problem_id", _S),
        _req("split", _S),
        _req("question", _S),
        _req("answer", _S),
        _req("prompt_text", _S),
    ),
    "rollouts": _schema(
        _req("problem_id", _S),
        _req("sample_index", _I32),
        _req("prompt_text", _S),
        _req("completion", _S),
        _req("n_prompt_tokens", _I32),
        _req("n_completion_tokens", _I32),
        _req("finish_reason", _S),
        _req("temperature", _F64),
        _req("top_p", _F64),
        _req("seed", _I64),
        _req("policy_checkpoint", _S),
        _req("correct", _BOOL),
        _opt("extracted_answer", _S),
    ),
    "orm_labels": _schema(
        _req("problem_id", _S),
        _req("sample_index", _I32),
        _req("label", _I8),
    ),
    "prm_labels": _schema(
        _req("problem_id", _S),
        _req("sample_index", _I32),
        _req("step_index", _I32),
        _req("step_text", _S),
        _req("step_end_token", _I32),
        _req("n_completions", _I32),
        _req("n_correct", _I32),
        _req("hard_label", _I8),
        _req("soft_label", _F64),
        _opt("exact_label", _I8),
    ),
    "rm_train": _schema(
        _req("rm_kind", _S),
        _req("problem_id", _S),
        _req("sample_index", _I32),
        _opt("step_index", _I32),
        _req("label", _F64),
        _req("source", _S),
        _req("origin_iteration", _I64),
        _req("epoch", _I32),
        _opt("source_table", _S),  # the table the label was read from (orm_labels, ...)
    ),
    "policy_samples": _schema(
        _req("step", _I64),
        _req("problem_id", _S),
        _req("sample_index", _I32),
        _req("completion", _S),
        _req("reward", _F64),
        # Every reward part scored for the output, by name (reward_models/parts/): the
        # verifier always, the others when weighted. A new part needs no new column.
        _opt("reward_parts", _PARTS),
        _opt("reward_rm", _F64),
        _req("advantage", _F64),
        _opt("kl", _F64),  # the KL the step applied; NULL where none (older stores: 0.0)
        _req("ratio_mean", _F64),
        _req("ratio_max", _F64),
        _req("n_completion_tokens", _I32),
        _req("correct", _BOOL),
        # Cut at max_new_tokens (finish reason "length"); stores written before it read NULL.
        _opt("truncated", _BOOL),
    ),
    # grpo.curriculum: each question's outcomes in the iteration's GRPO stage, and the weight
    # the stage drew it with from the earlier iterations' rows (docs/curriculum.md)
    "problem_pass_rates": _schema(
        _req("question_key", _S),
        _req("question", _S),
        _req("draws", _I32),  # times the stage's pool holds the question
        _req("n_samples", _I32),
        _req("n_correct", _I32),
        _req("pass_rate", _F64),
        _req("prior_samples", _I32),  # over the earlier iterations, what the weight read
        _req("prior_correct", _I32),
        _req("weight", _F64),
    ),
    "eval": _schema(
        # Which policy was evaluated: policy_0 (before RL), policy_k+1 after iteration k.
        _req("policy_iteration", _I64),
        _req("split", _S),
        _req("metric", _S),
        _opt("k", _I32),
        _req("value", _F64),
        _opt("stderr", _F64),
        _req("n", _I64),
        # A 95% interval where the metric has one (RM AUROCs: bootstrap over outputs); stores
        # written before it read these as NULL.
        _opt("ci_low", _F64),
        _opt("ci_high", _F64),
    ),
    # Each problem's value of the per-problem eval metrics (greedy_accuracy, sampled_accuracy,
    # pass@k, maj@k): their mean is the `eval` row. Two policies evaluated at the same seed see
    # the same problems, so comparisons pair on problem_index. Stores written before it lack it.
    "eval_problems": _schema(
        _req("policy_iteration", _I64),
        _req("split", _S),
        _req("problem_index", _I32),  # position in the evaluated list (questions may repeat)
        _req("problem_id", _S),
        _req("metric", _S),
        _req("k", _I32),
        _req("value", _F64),
        _opt("question", _S),  # the problem's text: its draws are one cluster (older: null)
    ),
    "metrics": _schema(
        _req("stage", _S),
        _opt("step", _I64),
        _req("name", _S),
        _req("value", _F64),
    ),
    # `itergrpo ablate`: every evaluation of every arm-seed run, in the ablation's own run
    # (run_id = ablation_id), committed once all its arm-seed runs are complete.
    "ablation": _schema(
        _req("ablation_id", _S),
        _req("arm", _S),
        _req("seed", _I64),
        _req("policy_iteration", _I64),
        _req("metric", _S),
        _opt("k", _I32),
        _req("value", _F64),
        _req("arm_run_id", _S),  # the arm-seed run the value was read from (its `eval` rows)
    ),
    # The per-problem values behind the `ablation` rows of the metrics the claims compare
    # (from each arm-seed run's `eval_problems`): the pairing by problem within a seed.
    "ablation_problems": _schema(
        _req("ablation_id", _S),
        _req("arm", _S),
        _req("seed", _I64),
        _req("policy_iteration", _I64),
        _req("metric", _S),
        _req("k", _I32),
        _req("problem_index", _I32),
        _req("problem_id", _S),
        _req("value", _F64),
        _req("arm_run_id", _S),
        _opt("question", _S),  # as in eval_problems
    ),
    # The commit log: one file per committed stage attempt; its existence is the commit.
    "stages": _schema(
        _req("stage", _S),
        _req("attempt", _I32),
        _req("status", _S),
        _req("started_at", _TS),
        _req("committed_at", _TS),
        _req("n_rows", _I64),
        _req("outputs", _S),  # json: {table: rows written}
        _req("info", _S),  # json: whatever the stage attached
    ),
}

STAGES_TABLE = "stages"

# The columns that identify a row within one (run, iteration) of a table: replay hashes them.
TABLE_KEYS: dict[str, tuple[str, ...]] = {
    "prompts": ("problem_id",),
    "rollouts": ("problem_id", "sample_index"),
    "orm_labels": ("problem_id", "sample_index"),
    "prm_labels": ("problem_id", "sample_index", "step_index"),
    "rm_train": ("rm_kind", "problem_id", "sample_index", "step_index", "epoch"),
    "policy_samples": ("step", "problem_id", "sample_index"),
    "problem_pass_rates": ("question_key",),
}

_DUCKDB_TYPES: dict[pa.DataType, str] = {
    pa.string(): "VARCHAR",
    pa.int64(): "BIGINT",
    pa.int32(): "INTEGER",
    pa.int8(): "TINYINT",
    pa.float64(): "DOUBLE",
    pa.bool_(): "BOOLEAN",
    pa.timestamp("us", tz="UTC"): "TIMESTAMPTZ",
    _PARTS: "MAP(VARCHAR, DOUBLE)",
}


@dataclass(frozen=True)
class LegacyColumn:
    """How a column reads from files written before it existed: `sql`, over the older
    files' `sources` columns (a read-time migration: stored files are never rewritten)."""

    sources: tuple[str, ...]
    sql: str


LEGACY_COLUMNS: dict[str, dict[str, LegacyColumn]] = {
    # Before reward parts were stored by name, policy_samples had one column per part.
    "policy_samples": {
        "reward_parts": LegacyColumn(
            ("reward_verifier", "reward_format"),
            "MAP(['verifier', 'format'], [reward_verifier, reward_format])",
        )
    },
}


def table_schema(table: str) -> pa.Schema:
    """The full schema of `table` (partition columns first); UnknownTableError if not a table."""
    try:
        return TABLE_SCHEMAS[table]
    except KeyError:
        raise UnknownTableError(
            f"unknown table {table!r}; the tables are: {', '.join(sorted(TABLE_SCHEMAS))}"
        ) from None


def file_schema(table: str) -> pa.Schema:
    """The schema of the Parquet files of `table`: the table schema without partition columns."""
    schema = table_schema(table)
    return pa.schema([f for f in schema if f.name not in PARTITION_COLUMNS])


def duckdb_type(typ: pa.DataType) -> str:
    """The DuckDB SQL type name for an Arrow type used in TABLE_SCHEMAS."""
    return _DUCKDB_TYPES[typ]


def _is_text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t))


def _compatible(got: pa.DataType, expected: pa.DataType) -> bool:
    """Whether an Arrow column of type `got` may be cast losslessly-checked into `expected`."""
    checks = (
        pa.types.is_integer,
        pa.types.is_floating,
        pa.types.is_timestamp,
        _is_text,
    )
    return pa.types.is_null(got) or any(c(got) and c(expected) for c in checks)


def _mismatch(table: str, field: pa.Field, got: str) -> SchemaMismatchError:
    return SchemaMismatchError(
        f"table {table!r}, column {field.name!r}: expected {field.type}, got {got}"
    )


def _column_from_arrow(table: str, field: pa.Field, col: pa.ChunkedArray) -> pa.ChunkedArray:
    if col.type == field.type:
        return col
    if not _compatible(col.type, field.type):
        raise _mismatch(table, field, str(col.type))
    try:
        return col.cast(field.type, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise _mismatch(table, field, f"{col.type} with values that do not fit ({exc})") from exc


def _column_from_python(table: str, field: pa.Field, values: list[Any]) -> pa.Array:
    try:
        return pa.array(values, type=field.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError, ValueError):
        pass
    for v in values:
        try:
            pa.array([v], type=field.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError, ValueError):
            raise _mismatch(table, field, f"{type(v).__name__} value {v!r:.60}") from None
    raise _mismatch(table, field, "values pyarrow cannot convert")


def conform(
    table: str,
    rows: pa.Table | Sequence[Mapping[str, Any]],
    *,
    partition: Mapping[str, Any],
) -> pa.Table:
    """Check `rows` against `table`'s schema and return them in the file schema.

    Partition columns may be given only if they equal `partition`; nullable columns may be
    left out (null). A missing required column, an unknown column, a wrong type or a null in
    a required column raises SchemaMismatchError naming the column and the expected type.
    """
    full = table_schema(table)
    schema = file_schema(table)
    columns: dict[str, pa.ChunkedArray | list[Any]]
    if isinstance(rows, pa.Table):
        columns = {name: rows.column(name) for name in rows.column_names}
        n = rows.num_rows
    else:
        rows = list(rows)
        if not rows:
            return schema.empty_table()
        n = len(rows)
        names: dict[str, None] = {}
        for row in rows:
            if not isinstance(row, Mapping):
                raise SchemaMismatchError(
                    f"table {table!r}: rows must be dicts or a pyarrow Table, got {type(row)!r}"
                )
            names.update(dict.fromkeys(row))
        columns = {name: [row.get(name) for row in rows] for name in names}
    extra = [name for name in columns if name not in full.names]
    if extra:
        raise SchemaMismatchError(
            f"table {table!r} has no column(s) {extra}; its columns are: {', '.join(full.names)}"
        )
    for name, expected in partition.items():
        if name in columns:
            col = columns.pop(name)
            values = col.to_pylist() if isinstance(col, pa.ChunkedArray) else col
            if any(v != expected for v in values):
                raise SchemaMismatchError(
                    f"table {table!r}, column {name!r}: rows must all be {expected!r} "
                    "(it is set by the stage you write in)"
                )
    arrays: list[pa.Array | pa.ChunkedArray] = []
    for field in schema:
        if field.name not in columns:
            if not field.nullable:
                raise SchemaMismatchError(
                    f"table {table!r}: missing required column {field.name!r} "
                    f"(expected {field.type})"
                )
            arrays.append(pa.nulls(n, field.type))
            continue
        col = columns[field.name]
        arr = (
            _column_from_arrow(table, field, col)
            if isinstance(col, pa.ChunkedArray)
            else _column_from_python(table, field, col)
        )
        if not field.nullable and arr.null_count:
            raise SchemaMismatchError(
                f"table {table!r}, column {field.name!r} (expected {field.type}) is required "
                f"but has {arr.null_count} null value(s)"
            )
        _require_finite(table, field.name, arr, columns)
        arrays.append(arr)
    return pa.Table.from_arrays(arrays, schema=schema)


# The column that names what a row measures, shown when one of its values is not finite.
_LABEL_COLUMNS = ("name", "metric", "problem_id")


def _require_finite(
    table: str,
    name: str,
    arr: pa.Array | pa.ChunkedArray,
    columns: Mapping[str, pa.ChunkedArray | list[Any]],
) -> None:
    """The store never holds NaN or inf (an undefined metric has no row): refuse them here,
    before any file is written, naming the table, column and first offending row."""
    import pyarrow.compute as pc

    if pa.types.is_map(arr.type):  # every value of every row's map (row: the map's owner)
        rows = pa.chunked_array([arr]) if isinstance(arr, pa.Array) else arr
        chunks = [c for c in rows.chunks if not pa.types.is_null(c.type)]
        for values in (c.items for c in chunks):
            # min_count=0: rows with no map (or empty maps) have all their values finite;
            # pyarrow < 26 answers null for "all" of nothing otherwise.
            finite = pc.all(pc.is_finite(values), min_count=0).as_py()
            if pa.types.is_floating(values.type) and not finite:
                raise NonFiniteValueError(
                    f"table {table!r}, column {name!r}: a value is NaN or infinite; nothing was "
                    "written. A reward weight, a reward model's output or diverged weights are "
                    "the usual cause"
                )
        return
    if not pa.types.is_floating(arr.type):
        return
    bad = pc.invert(pc.fill_null(pc.is_finite(arr), True))
    n_bad = pc.sum(bad).as_py() or 0
    if not n_bad:
        return
    row = int(pc.index(bad, True).as_py())
    label = next((c for c in _LABEL_COLUMNS if c in columns and c != name), None)
    what = ""
    if label is not None:
        col = columns[label]
        labels = col.to_pylist() if isinstance(col, pa.ChunkedArray) else col
        what = f" ({label} {labels[row]!r})"
    raise NonFiniteValueError(
        f"table {table!r}, column {name!r}: {n_bad} value(s) are NaN or infinite, first in row "
        f"{row}{what}; nothing was written. A reward weight, a reward model's output or "
        "diverged weights are the usual cause"
    )
