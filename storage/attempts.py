"""The data files of stage attempts in the store's areas (storage/layout.py): listing them, the
commit readers see, and the moves between areas: into tables/ by a commit, out to
attempts/superseded/ when a later attempt replaces it, and a run tidied when its writer opens
it (a commit a kill cut short is finished; files that stores of earlier versions kept in
tables/ beside the committed ones are moved out)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from storage.atomic import fsync_dir
from storage.layout import (
    COMMITTED,
    FILE_RE,
    SUPERSEDED,
    UNCOMMITTED,
    DataFile,
    StoreLayout,
    validate_run_id,
)
from storage.schemas import STAGES_TABLE, TABLE_SCHEMAS, table_schema

# (run_id, iteration, stage, attempt): one commit
Commit = tuple[str, int, str, int]


def _key_value(folder: Path) -> str:
    return folder.name.split("=", 1)[1]


def partitions(
    layout: StoreLayout,
    area: str,
    table: str,
    run_id: str | None = None,
    iterations: Iterable[int] | None = None,
) -> list[tuple[str, int, Path]]:
    """(run_id, iteration, folder) of each partition folder of `table` in `area` (of `run_id`
    and `iterations` only, when given), in order."""
    base = layout.root / area / table
    wanted = None if iterations is None else {int(i) for i in iterations}
    if run_id is not None:
        run_dirs = [base / f"run_id={run_id}"]
    else:
        run_dirs = sorted(base.glob("run_id=*")) if base.is_dir() else []
    found = []
    for run_dir in run_dirs:
        for folder in run_dir.glob("iteration=*") if run_dir.is_dir() else []:
            value = _key_value(folder)
            if value.isdigit() and (wanted is None or int(value) in wanted):
                found.append((_key_value(run_dir), int(value), folder))
    return sorted(found, key=lambda p: (p[0], p[1]))


def stage_files(pdir: Path, stage: str | None = None) -> list[tuple[Path, str, int]]:
    """(path, stage, attempt) of each data file in partition folder `pdir` (of `stage` only,
    when given); none when the folder does not exist."""
    if not pdir.is_dir():
        return []
    found = []
    for name in sorted(os.listdir(pdir)):
        m = FILE_RE.match(name)
        if m is not None and (stage is None or m["stage"] == stage):
            found.append((pdir / name, m["stage"], int(m["attempt"])))
    return found


def data_files(
    layout: StoreLayout,
    table: str,
    *,
    run_id: str | None = None,
    iterations: Iterable[int] | None = None,
    area: str = COMMITTED,
) -> list[DataFile]:
    """All data files of `table` in `area` (tables/, where stores of earlier versions keep
    uncommitted and superseded files too), in path order."""
    table_schema(table)
    if run_id is not None:
        validate_run_id(run_id)
    out = []
    for rid, it, pdir in partitions(layout, area, table, run_id, iterations):
        found = []
        for name in os.listdir(pdir):
            if m := FILE_RE.match(name):
                part, attempt = int(m["part"] or 0), int(m["attempt"])
                found.append(DataFile(pdir / name, table, rid, it, m["stage"], attempt, part))
        out.extend(sorted(found, key=lambda f: (f.stage, f.attempt, f.part)))
    return out


def commits(
    layout: StoreLayout, run_id: str | None = None, iterations: Iterable[int] | None = None
) -> set[Commit]:
    """Each stage's commit readers see: its highest committed attempt (a stage has more than
    one only when one superseded another, and a kill came before the older one moved out)."""
    latest: dict[tuple[str, int, str], int] = {}
    for f in data_files(layout, STAGES_TABLE, run_id=run_id, iterations=iterations):
        key = (f.run_id, f.iteration, f.stage)
        latest[key] = max(latest.get(key, 0), f.attempt)
    return {(*key, attempt) for key, attempt in latest.items()}


def _move(src: Path, folder: Path) -> None:
    """`src` renamed into `folder` (same name), both folders' entries flushed."""
    folder.mkdir(parents=True, exist_ok=True)
    os.replace(src, folder / src.name)
    fsync_dir(folder)
    fsync_dir(src.parent)


def publish(layout: StoreLayout, run_id: str, iteration: int, stage: str, attempt: int) -> None:
    """Move the files of a committed attempt from attempts/uncommitted/ into tables/."""
    for table in TABLE_SCHEMAS:
        pdir = layout.partition_dir(table, run_id, iteration, UNCOMMITTED)
        for path, _, number in stage_files(pdir, stage):
            if number == attempt:
                _move(path, layout.partition_dir(table, run_id, iteration))


def retire(layout: StoreLayout, run_id: str, iteration: int, stage: str, current: int) -> None:
    """Move the files of `stage`'s attempts before `current` (the commit readers see), and
    their commit records, from tables/ to attempts/superseded/."""
    for table in TABLE_SCHEMAS:
        pdir = layout.partition_dir(table, run_id, iteration)
        for path, _, number in stage_files(pdir, stage):
            if number < current:
                _move(path, layout.partition_dir(table, run_id, iteration, SUPERSEDED))


def tidy_run(layout: StoreLayout, run_id: str) -> None:
    """Leave tables/ holding the committed attempts of `run_id` only (the caller holds the run's
    lock): finish the moves of commits a kill interrupted, and move out the uncommitted and
    superseded files a store written before these areas kept there."""
    latest = {(it, stage): attempt for _, it, stage, attempt in commits(layout, run_id)}
    for (iteration, stage), attempt in latest.items():
        publish(layout, run_id, iteration, stage, attempt)
        retire(layout, run_id, iteration, stage, attempt)
    for table in TABLE_SCHEMAS:
        for f in data_files(layout, table, run_id=run_id):
            if f.attempt > latest.get((f.iteration, f.stage), 0):
                _move(f.path, layout.partition_dir(table, run_id, f.iteration, UNCOMMITTED))
