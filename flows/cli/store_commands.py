"""The store commands: `itergrpo sql` (read-only DuckDB over the committed tables), `tables`
(row counts and columns), `runs` (status of each run) and `export` (a run's table as Parquet,
JSON lines or a Hugging Face datasets folder). They load neither torch nor Prefect."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa

from flows.cli.options import store_option
from flows.errors import OutputPathError
from flows.tracking.record import mlflow_run
from storage.errors import StoreError
from storage.export import EXPORTS, FORMATS, export_run
from storage.schemas import TABLE_SCHEMAS
from storage.store import RunStore

_MAX_CELL = 60

# ---- output -------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else f"{value:.6g}"
    text = str(value).replace("\n", "\\n")
    return text if len(text) <= _MAX_CELL else text[: _MAX_CELL - 1] + "…"


def format_table(table: pa.Table, *, max_rows: int = 0) -> str:
    """A plain-text grid of `table`: numbers right-aligned, long text cut, NULL shown."""
    shown = table.slice(0, max_rows) if max_rows else table
    names = table.column_names
    right = [
        pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
        for t in table.schema.types
    ]
    rows = [[_cell(v) for v in row.values()] for row in shown.to_pylist()]
    widths = [max([len(n), *(len(r[i]) for r in rows)]) for i, n in enumerate(names)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)
        ]
        return " | ".join(parts).rstrip()

    out = [line(names), "-+-".join("-" * w for w in widths)]
    out += [line(r) for r in rows]
    more = table.num_rows - shown.num_rows
    tail = f"({table.num_rows} row{'s' if table.num_rows != 1 else ''}"
    tail += f", {more} not shown: add --max-rows 0 or LIMIT)" if more else ")"
    return "\n".join([*out, tail])


def _write_result(table: pa.Table, fmt: str, output: str | None, max_rows: int) -> None:
    try:
        _write_formatted(table, fmt, output, max_rows)
    except OSError as exc:
        if not output:
            raise  # stdout failed: not a path the user can fix
        raise OutputPathError(f"--output {output} cannot be written: {exc}") from exc


def _write_formatted(table: pa.Table, fmt: str, output: str | None, max_rows: int) -> None:
    if fmt == "parquet":
        if not output:
            raise StoreError("--format parquet needs --output FILE")
        import pyarrow.parquet as pq

        pq.write_table(table, output)
        return
    if fmt == "csv":
        import pyarrow.csv as pacsv

        if output:
            pacsv.write_csv(table, output)
        else:
            sys.stdout.buffer.write(_csv_bytes(table, pacsv))
            sys.stdout.flush()
        return
    if fmt == "json":
        lines = [json.dumps(r, default=str, ensure_ascii=False) for r in table.to_pylist()]
        text = "[\n" + ",\n".join(lines) + "\n]\n" if lines else "[]\n"
    else:
        text = format_table(table, max_rows=0 if output else max_rows) + "\n"
    _emit(text, output)


def _csv_bytes(table: pa.Table, pacsv: Any) -> bytes:
    sink = pa.BufferOutputStream()
    pacsv.write_csv(table, sink)
    return bytes(sink.getvalue().to_pybytes())


def _emit(text: str, output: str | None, stream: TextIO | None = None) -> None:
    if output:
        try:
            Path(output).write_text(text)
        except OSError as exc:
            raise OutputPathError(f"--output {output} cannot be written: {exc}") from exc
    else:
        (stream or sys.stdout).write(text)


# ---- sql ----------------------------------------------------------------------------------


def add_sql(sub: Any) -> None:
    p = sub.add_parser(
        "sql",
        help="query the store with DuckDB SQL (read-only)",
        description="Run a read-only SQL query over one view per table "
        f"({', '.join(TABLE_SCHEMAS)}); only committed stages are visible.",
    )
    p.add_argument("query", nargs="?", help='e.g. "SELECT iteration, avg(value) FROM eval ..."')
    store_option(p)
    p.add_argument("--format", choices=["table", "csv", "json", "parquet"], default="table")
    p.add_argument("--output", "-o", help="write the result to FILE instead of stdout")
    p.add_argument(
        "--max-rows", type=int, default=200, help="rows printed in table format (0: all)"
    )
    p.add_argument(
        "--print-views",
        action="store_true",
        help="print the CREATE VIEW statements (for the duckdb CLI) and exit",
    )
    p.set_defaults(func=cmd_sql)


def cmd_sql(args: argparse.Namespace) -> int:
    from storage.sql import run_query, view_statements

    store = RunStore(args.store).require_existing()
    if args.print_views:
        _emit("\n".join(view_statements(store)) + "\n", args.output)
        return 0
    if not args.query:
        raise StoreError(
            'give a query, e.g. itergrpo sql "SELECT * FROM eval LIMIT 10" (tables: '
            f"{', '.join(TABLE_SCHEMAS)}; `itergrpo tables` lists their columns)"
        )
    _write_result(run_query(store, args.query), args.format, args.output, args.max_rows)
    return 0


# ---- tables -------------------------------------------------------------------------------


def add_tables(sub: Any) -> None:
    p = sub.add_parser("tables", help="list tables with committed row counts and columns")
    store_option(p)
    p.set_defaults(func=cmd_tables)


def cmd_tables(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    store = RunStore(args.store).require_existing()
    rows = []
    for name, schema in TABLE_SCHEMAS.items():
        count: int | str = 0
        for path in store.committed_files(name):
            try:
                count += pq.read_metadata(path).num_rows
            except (OSError, pa.ArrowException):
                count = f"{count}+ (corrupt file {path})"
                break
        columns = ", ".join(f"{f.name} {f.type}" for f in schema)
        rows.append({"table": name, "rows": str(count), "columns": columns})
    print(_long_table(rows))
    return 0


def _long_table(rows: list[dict[str, str]]) -> str:
    """Tables with their full column lists (too wide for one grid row each)."""
    width = max(len(r["table"]) for r in rows)
    return "\n".join(
        f"{r['table'].ljust(width)}  {r['rows']:>10} rows   {r['columns']}" for r in rows
    )


# ---- runs ---------------------------------------------------------------------------------


def add_runs(sub: Any) -> None:
    p = sub.add_parser("runs", help="list runs with status and iterations done")
    store_option(p)
    p.set_defaults(func=cmd_runs)


def failure_line(failure: dict[str, Any]) -> str:
    """A stored failure record (flows.loop.failure_record) as one line: where, type, message."""
    stage, iteration = failure.get("stage"), failure.get("iteration")
    where = f"in {stage} (iteration {iteration})" if stage else "outside a stage"
    return f"{where}: {failure.get('type')}: {failure.get('message')}"


def cmd_runs(args: argparse.Namespace) -> int:
    store = RunStore(args.store).require_existing()
    runs = store.runs()
    tracked = {r["run_id"]: mlflow_run(store.run_dir(r["run_id"])) for r in runs}
    cols = ["run_id", "status", "iterations_done", "created_at", "updated_at"]
    stopped = {r["run_id"]: r["failure"] for r in runs if isinstance(r.get("failure"), dict)}
    if stopped:  # why a failed or interrupted run stopped: in the table, and in full below
        cols.append("stopped")
        runs = [{**r, "stopped": _stopped_cell(stopped.get(r["run_id"]))} for r in runs]
    forked = {r["run_id"]: r["forked_from"] for r in runs if isinstance(r.get("forked_from"), dict)}
    if forked:  # runs that started as a copy of another's stages (`itergrpo ablate`)
        cols.append("forked_from")
        runs = [{**r, "forked_from": _forked_cell(forked.get(r["run_id"]))} for r in runs]
    if any(tracked.values()):  # runs that report to MLflow: its run id, and the page below
        cols.append("mlflow_run_id")
        runs = [{**r, "mlflow_run_id": (tracked[r["run_id"]] or (None,))[0]} for r in runs]
    table = pa.Table.from_pylist(
        [{c: None if r.get(c) is None else str(r.get(c)) for c in cols} for r in runs],
        schema=pa.schema([(c, pa.string()) for c in cols]),
    )
    print(format_table(table))
    for run_id, failure in stopped.items():
        print(f"{run_id} stopped {failure_line(failure)}")
    for run in runs:
        if run.get("damage"):
            print(run["damage"])
    for run_id, link in tracked.items():
        if link is not None:
            print(f"MLflow run of {run_id}: {link[1]}")
    return 0


def _forked_cell(forked: dict[str, Any] | None) -> str | None:
    """`ablate-micro-grpo_os-s0 through label:1`: the run a fork copied, and its last stage."""
    if forked is None:
        return None
    stage, iteration = (forked.get("through") or [None, None])[:2]
    return f"{forked.get('run_id')} through {stage}:{iteration}"


def _stopped_cell(failure: dict[str, Any] | None) -> str | None:
    if failure is None:
        return None
    stage = failure.get("stage")
    where = f"{stage}:{failure.get('iteration')}" if stage else "-"
    return f"{where} {failure.get('type')}"


# ---- export -------------------------------------------------------------------------------


def add_export(sub: Any) -> None:
    p = sub.add_parser(
        "export",
        help="write a run's committed rows as Parquet, JSON lines or a Hugging Face dataset",
        description="Write the committed rows of one run's table into a new folder: "
        "<table>.parquet or <table>.jsonl per table, or a `datasets` folder "
        "(datasets.load_from_disk; labels: a DatasetDict of orm_labels and prm_labels).",
    )
    p.add_argument("--run", required=True, dest="run_id", help="the run (`itergrpo runs`)")
    p.add_argument("--table", required=True, choices=list(EXPORTS))
    p.add_argument("--format", choices=FORMATS, default="parquet")
    p.add_argument("--out", required=True, help="a new folder to write")
    store_option(p)
    p.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    store = RunStore(args.store).require_existing()
    try:
        rows = export_run(store, args.run_id, args.table, args.format, Path(args.out))
    except OSError as exc:
        raise OutputPathError(f"--out {args.out} cannot be written: {exc}") from exc
    counts = ", ".join(f"{n} {table} rows" for table, n in rows.items())
    print(f"exported {counts} of run {args.run_id} as {args.format} to {args.out}")
    return 0
