"""Forking a run: run B starts with copies of stages run A committed, as if B had computed them.

`fork_run` copies, for each (stage, iteration) given, every committed data file of that stage
attempt (the files carry no run id: it lives in the partition path, so a copy under B's
partition *is* the row with run_id rewritten), the checkpoint directories the caller names, and
last the commit records. Files are hard-linked where the filesystem allows (a committed file is
never modified in place: later writes replace it by rename), else copied. Which stages may be
shared, and which checkpoints a stage wrote, is the caller's knowledge (flows/fork.py): the
store knows files, not what computed them.

Atomicity follows the stage commit: data files (under attempts/uncommitted/) and checkpoints
first, then in execution order each commit record, whose stage's files then move into tables/.
An exception on the way removes what was written, so B is left with no committed stage; a kill
during the commit records leaves a prefix of committed stages whose files are all kept (B's
next writer finishes their moves), which is an ordinary interrupted run that `resume`
continues. B's status.json records `forked_from`.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from storage.atomic import atomic_write_parquet, fsync_dir, temp_sibling
from storage.attempts import publish, stage_files
from storage.checkpoints import checkpoint_path
from storage.errors import StoreError
from storage.layout import COMMITTED, FILE_RE, UNCOMMITTED, validate_run_id
from storage.schemas import STAGES_TABLE, TABLE_SCHEMAS
from storage.store import RunStore, StageReaders

# String columns that hold a path under checkpoints/<run_id>/ (relative to the store root): a
# fork points them at B's copy, so B's rows equal those B would have written itself.
RUN_PATH_COLUMNS: dict[str, tuple[str, ...]] = {"rollouts": ("policy_checkpoint",)}


def _link_or_copy(src: str | Path, dst: str | Path) -> None:
    """Hard-link `src` to `dst` (no bytes copied), or copy it where links are refused."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _place_file(src: Path, dst: Path) -> None:
    """`src` at `dst`, atomically (a temp sibling renamed into place)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(dst)
    try:
        _link_or_copy(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(dst.parent)


def _place_dir(src: Path, dst: Path) -> None:
    """A copy of directory `src` at `dst` (replacing a leftover one), renamed into place whole.

    Not storage.atomic.atomic_directory: it re-modes every file it holds, which through a hard
    link would change run A's files too."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(dst)
    try:
        shutil.copytree(src, tmp, copy_function=_link_or_copy)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if dst.exists():
        shutil.rmtree(dst)
    os.replace(tmp, dst)
    fsync_dir(dst.parent)


class _Fork:
    """One fork in progress: what it has written, so a failure can take it back."""

    def __init__(self, store: RunStore, source: str, target: str) -> None:
        self.store, self.source, self.target = store, source, target
        self.written: list[Path] = []  # files and directories, in the order written
        self.records: list[Path] = []  # the commit records written

    def clear_leftovers(self, stage: str, iteration: int) -> None:
        """Remove B's uncommitted files of `stage` (a start that failed before committing it),
        as a new stage attempt would."""
        for table in TABLE_SCHEMAS:
            for area in (COMMITTED, UNCOMMITTED):
                pdir = self.store.partition_dir(table, self.target, iteration, area)
                for path, _, _ in stage_files(pdir, stage):
                    path.unlink(missing_ok=True)

    def copy_data(self, stage: str, iteration: int) -> None:
        for table in TABLE_SCHEMAS:
            if table == STAGES_TABLE:
                continue
            files = self.store.committed_files(
                table, run_id=self.source, iterations=[iteration], stage=stage
            )
            for src in files:
                dst = (
                    self.store.partition_dir(table, self.target, iteration, UNCOMMITTED) / src.name
                )
                # undone where it is: still uncommitted, or moved into tables/ by its commit
                published = self.store.partition_dir(table, self.target, iteration) / src.name
                self.written += [dst, published]
                if table in RUN_PATH_COLUMNS:
                    atomic_write_parquet(dst, self._repointed(table, src))
                else:
                    _place_file(src, dst)

    def _repointed(self, table: str, src: Path) -> Any:
        data = pq.read_table(src)
        old, new = f"checkpoints/{self.source}/", f"checkpoints/{self.target}/"
        for column in RUN_PATH_COLUMNS[table]:
            if column not in data.column_names:
                continue
            values = [
                new + v[len(old) :] if isinstance(v, str) and v.startswith(old) else v
                for v in data.column(column).to_pylist()
            ]
            index = data.column_names.index(column)
            field = data.schema.field(index)
            data = data.set_column(index, field, [values])
        return data

    def copy_checkpoint(self, role: str, iteration: int) -> None:
        src = checkpoint_path(self.store.root, self.source, role, iteration)
        if not src.is_dir():
            return  # e.g. no PRM in a run that trains none
        dst = checkpoint_path(self.store.root, self.target, role, iteration)
        self.written.append(dst)
        _place_dir(src, dst)

    def commit(self, stage: str, iteration: int) -> None:
        """B's commit record of `stage`: A's, its info naming the run it came from."""
        (src,) = self.store.committed_files(
            STAGES_TABLE, run_id=self.source, iterations=[iteration], stage=stage
        )
        record = pq.read_table(src)
        infos = [
            json.dumps({**json.loads(i), "forked_from": self.source}, sort_keys=True)
            for i in record.column("info").to_pylist()
        ]
        index = record.column_names.index("info")
        record = record.set_column(index, record.schema.field(index), [infos])
        dst = self.store.partition_dir(STAGES_TABLE, self.target, iteration) / src.name
        self.records.append(dst)
        atomic_write_parquet(dst, record)
        m = FILE_RE.match(src.name)
        assert m is not None  # committed_files lists data files only
        publish(self.store, self.target, iteration, stage, int(m["attempt"]))

    def undo(self) -> None:
        """Remove what was written, commit records first."""
        for path in [*self.records, *reversed(self.written)]:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def fork_run(
    store: RunStore,
    source: str,
    target: str,
    config: Mapping[str, Any],
    *,
    stages: Sequence[tuple[str, int]],
    checkpoints: Sequence[tuple[str, int]],
    stage_readers: StageReaders | None = None,
) -> None:
    """Create run `target` (config `config`) holding `source`'s commits of `stages` (in
    execution order), their rows and the checkpoint directories `checkpoints` (role, iteration)
    of `source` (absent ones are skipped); its status records `forked_from`.

    `target` may exist only without a committed stage (a start that failed before its first
    commit). StoreError when a stage is not committed in `source`. Whatever fails, `target`
    is left with no committed stage.
    """
    validate_run_id(source)
    if not stages:
        raise StoreError("fork_run needs at least one stage to copy")
    committed = {(str(s["stage"]), int(s["iteration"])) for s in store.committed_stages(source)}
    missing = [s for s in stages if s not in committed]
    if missing:
        raise StoreError(f"cannot fork run {source!r}: stages {missing} are not committed in it")
    if store.run_dir(target).is_dir() and store.committed_stages(target):
        raise StoreError(f"cannot fork into run {target!r}: it has committed stages already")
    with store.open_run(target, config, stage_readers=stage_readers) as writer:
        fork = _Fork(store, source, target)
        last_stage, last_iteration = stages[-1]
        provenance = {"run_id": source, "through": [last_stage, last_iteration]}
        try:
            for stage, iteration in stages:
                fork.clear_leftovers(stage, iteration)
                fork.copy_data(stage, iteration)
            for role, iteration in checkpoints:
                fork.copy_checkpoint(role, iteration)
            for stage, iteration in stages:
                fork.commit(stage, iteration)
            writer.set_status("created", forked_from=provenance, failure=None)
        except BaseException:
            fork.undo()
            raise
