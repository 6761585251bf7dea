"""Command-line entry point: `itergrpo <command>`.

Each subcommand is one `cmd_*` function plus an `add_*` function that declares its arguments,
registered in COMMANDS. Commands of other modules go in LAZY_COMMANDS and are imported only
when asked for, so `itergrpo sql` starts without loading torch or Prefect.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa

from flows.errors import OutputPathError
from grpo_core.contracts.errors import UserError
from storage.errors import StoreError
from storage.layout import STORE_ENV
from storage.schemas import TABLE_SCHEMAS
from storage.store import RunStore

AddCommand = Callable[[Any], None]

_MAX_CELL = 60
# The loggers of itergrpo's own lines (stage starts, GRPO steps, tables): INFO and up.
PACKAGE_LOGGERS = ("itergrpo", "flows", "grpo_core", "reward_models", "storage")


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


def nonempty(text: str) -> str:
    """An argparse type: an empty --store or --run-id is a typo, not 'the default'."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty (leave the option out for the default)")
    return text


STORE_HELP = (
    f"run store directory (default ${STORE_ENV}, then the config's store.root, "
    "then ./itergrpo-store)"
)


def store_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", type=nonempty, help=STORE_HELP)


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


def cmd_runs(args: argparse.Namespace) -> int:
    runs = RunStore(args.store).require_existing().runs()
    cols = ["run_id", "status", "iterations_done", "created_at", "updated_at"]
    table = pa.Table.from_pylist(
        [{c: None if r.get(c) is None else str(r.get(c)) for c in cols} for r in runs],
        schema=pa.schema([(c, pa.string()) for c in cols]),
    )
    print(format_table(table))
    return 0


# ---- registry -----------------------------------------------------------------------------

COMMANDS: dict[str, AddCommand] = {"sql": add_sql, "tables": add_tables, "runs": add_runs}
# Commands of modules that load torch and Prefect, with their one-line help (shown by
# `itergrpo --help` without importing them): "module": ("function adding them", {name: help}).
LAZY_COMMANDS: dict[str, tuple[str, dict[str, str]]] = {
    "flows.run_commands": (
        "add_run_commands",
        {
            "run": "run the iterative RL loop",
            "demo": "the built-in demo: warm start + 3 iterations on CPU",
            "resume": "resume a run from its stored config and artifacts",
            "report": "plots and a markdown summary of a run",
            "serve": "serve the flow as a Prefect deployment (UI-triggered runs)",
        },
    ),
    "flows.ablate_commands": (
        "add_ablate_commands",
        {"ablate": "arms x seeds from one shared policy_0: the paper's RL orderings judged"},
    ),
}


def command_help(name: str) -> str:
    """The one-line help of a lazily imported command."""
    return next(helps[name] for _, helps in LAZY_COMMANDS.values() if name in helps)


def build_parser(command: str | None) -> argparse.ArgumentParser:
    """The parser; a lazy module is imported only when its own command runs (--help lists
    its commands from LAZY_COMMANDS, so it starts in a fraction of a second)."""
    parser = argparse.ArgumentParser(prog="itergrpo", description="Iterative GRPO runs and store.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in COMMANDS.values():
        add(sub)
    for module, (func, helps) in LAZY_COMMANDS.items():
        if command in helps:
            getattr(importlib.import_module(module), func)(sub)
        else:
            for name, text in helps.items():
                sub.add_parser(name, help=text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # Per-file "Loading weights" bars from transformers would drown the stage bars.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    # Our own progress lines (stage starts, metrics) are INFO; libraries stay at WARNING.
    for name in PACKAGE_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)
    command = next((a for a in args_list if not a.startswith("-")), None)
    known = command in COMMANDS or any(command in h for _, h in LAZY_COMMANDS.values())
    parser = build_parser(command if known else None)
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:
        return int(exc.code or 0) if isinstance(exc.code, int) else 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except UserError as exc:  # the user's to fix: one line; anything else is a bug (traceback)
        print(f"itergrpo {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
