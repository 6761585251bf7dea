"""Names in a run store: its default root, run ids, stage names, iterations, the data file
names `<stage>-<attempt>[-part<n>].parquet` (what a path says about its file) and the areas a
file lives in: `tables/` (committed attempts) or `attempts/uncommitted|superseded/`."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path

from storage.errors import InvalidRunIdError
from storage.schemas import table_schema

STORE_ENV = "ITERGRPO_STORE"
DEFAULT_ROOT = "./itergrpo-store"
# What a store root holds; a non-empty directory with none of these is not a store.
STORE_ENTRIES = frozenset({"tables", "runs", "checkpoints", "reports", "attempts"})

# Where a data file lives: readers of the Parquet tree (pyarrow, DuckDB's read_parquet, pandas,
# Spark) look under tables/, which holds committed attempts only; a stage attempt writes its
# files under attempts/uncommitted/ and its commit moves them in, and an attempt a later one
# superseded moves out to attempts/superseded/ (each a hive tree of its own: docs/store-and-sql.md).
COMMITTED = "tables"
UNCOMMITTED = "attempts/uncommitted"
SUPERSEDED = "attempts/superseded"
AREAS = (COMMITTED, UNCOMMITTED, SUPERSEDED)

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_STAGE_RE = re.compile(r"^[A-Za-z0-9_]{1,64}$")
FILE_RE = re.compile(r"^(?P<stage>[A-Za-z0-9_]+)-(?P<attempt>\d+)(?:-part(?P<part>\d+))?\.parquet$")


def validate_run_id(run_id: str) -> str:
    """Return `run_id` if it is letters, digits, '-', '_', '.' (not starting with '.' or '-')."""
    if not isinstance(run_id, str) or not RUN_ID_RE.match(run_id):
        raise InvalidRunIdError(
            f"invalid run id {run_id!r}: use 1-128 letters, digits, '-', '_' or '.', "
            "starting with a letter or digit"
        )
    return run_id


def validate_stage(stage: str) -> str:
    """Return `stage` if it is letters, digits and '_' (it is part of file names)."""
    if not isinstance(stage, str) or not _STAGE_RE.match(stage):
        raise ValueError(f"invalid stage name {stage!r}: use letters, digits and '_' only")
    return stage


def validate_iteration(iteration: int) -> int:
    if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
        raise ValueError(f"iteration must be an int >= 0 (got {iteration!r})")
    return iteration


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class DataFile:
    """One Parquet file of a table, with what its path says about it."""

    path: Path
    table: str
    run_id: str
    iteration: int
    stage: str
    attempt: int
    part: int = 0


class StoreLayout:
    """Where a store root keeps what: tables, runs, checkpoints (the paths, not the files)."""

    root: Path

    @property
    def tables_dir(self) -> Path:
        return self.root / "tables"

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / validate_run_id(run_id)

    def partition_dir(self, table: str, run_id: str, iteration: int, area: str = COMMITTED) -> Path:
        """The folder of `table`'s files of one run and iteration in `area` (tables/ unless
        told: the one readers see)."""
        table_schema(table)  # an unknown table name is refused
        return self.root / area / table / f"run_id={run_id}" / f"iteration={iteration}"
