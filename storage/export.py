"""A run's committed rows written out for other tools (`itergrpo export`): Parquet files, JSON
lines, or a Hugging Face `datasets` folder (`datasets.load_from_disk`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from storage.atomic import atomic_directory
from storage.errors import StoreError
from storage.store import RunStore

# What `--table` names -> the store tables it writes (labels: the ORM's and the PRM's).
EXPORTS: dict[str, tuple[str, ...]] = {
    "rollouts": ("rollouts",),
    "labels": ("orm_labels", "prm_labels"),
    "policy_samples": ("policy_samples",),
}
FORMATS = ("parquet", "jsonl", "hf")

Tables = Mapping[str, pa.Table]


def _for_datasets(table: pa.Table) -> pa.Table:
    """`table` as `datasets` holds it: map columns (policy_samples.reward_parts) as lists of
    {key, value} (what a map is in Arrow), and no rows as one empty batch (it casts no fewer)."""
    empty = [pa.RecordBatch.from_pylist([], schema=table.schema)]
    table = pa.Table.from_batches(table.to_batches() or empty, table.schema)
    for index, field in enumerate(table.schema):
        if pa.types.is_map(field.type):
            item = pa.struct([("key", field.type.key_type), ("value", field.type.item_type)])
            column = table.column(index).cast(pa.list_(item))
            table = table.set_column(index, pa.field(field.name, column.type), column)
    return table


def _write_parquet(tables: Tables, folder: Path) -> None:
    for name, table in tables.items():
        pq.write_table(table, folder / f"{name}.parquet")


def _write_jsonl(tables: Tables, folder: Path) -> None:
    map_columns = {
        name: [f.name for f in t.schema if pa.types.is_map(f.type)] for name, t in tables.items()
    }
    for name, table in tables.items():
        with open(folder / f"{name}.jsonl", "w", encoding="utf-8") as out:
            for batch in table.to_batches():
                for row in batch.to_pylist():
                    for column in map_columns[name]:  # a map reads as (key, value) pairs
                        row[column] = None if row[column] is None else dict(row[column])
                    out.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")


def _write_hf(tables: Tables, folder: Path) -> None:
    import datasets

    datasets.disable_progress_bars()  # one bar per table on the console says nothing here
    sets = {name: datasets.Dataset(_for_datasets(t)) for name, t in tables.items()}
    # an empty dataset saved in the default zero shards does not load back
    shards = {name: 1 for name, t in tables.items() if t.num_rows == 0}
    if len(sets) == 1:
        ((name, dataset),) = sets.items()
        dataset.save_to_disk(str(folder), num_shards=shards.get(name))
    else:
        datasets.DatasetDict(sets).save_to_disk(str(folder), num_shards=shards or None)


WRITERS: dict[str, Callable[[Tables, Path], None]] = {
    "parquet": _write_parquet,
    "jsonl": _write_jsonl,
    "hf": _write_hf,
}


def export_run(store: RunStore, run_id: str, what: str, fmt: str, out: Path) -> dict[str, int]:
    """Write `run_id`'s committed rows of `what` (a key of EXPORTS) as `fmt` into the new
    folder `out` (written whole, or not at all); the rows written per table."""
    if what not in EXPORTS:
        raise StoreError(f"--table {what!r} cannot be exported: choose from {', '.join(EXPORTS)}")
    if fmt not in WRITERS:
        raise StoreError(
            f"--format {fmt!r} is not an export format: choose from {', '.join(FORMATS)}"
        )
    if run_id not in store.run_ids():
        raise StoreError(
            f"no run {run_id!r} in store {store.root}; its runs: "
            f"{', '.join(store.run_ids()) or 'none'} (`itergrpo runs` lists them)"
        )
    if out.exists():
        raise StoreError(f"--out {out} exists: give a new folder (the export writes it whole)")
    tables = {table: store.read(table, run_id=run_id) for table in EXPORTS[what]}
    if not any(t.num_rows for t in tables.values()):
        raise StoreError(
            f"run {run_id!r} has no committed rows in {' or '.join(tables)}: nothing to export"
        )
    with atomic_directory(out) as folder:
        WRITERS[fmt](tables, folder)
    return {name: t.num_rows for name, t in tables.items()}
