"""Writing one run: the writer that holds its lock, and stage attempts whose files become
visible only when their commit record is written (storage/store.py reads them). An attempt
writes under attempts/uncommitted/; its commit moves them into tables/ (storage/attempts.py)."""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa

from storage.atomic import TMP_PREFIX, atomic_write_parquet, atomic_write_text
from storage.attempts import publish, retire, stage_files
from storage.errors import StageAlreadyCommittedError, StoreError
from storage.layout import (
    AREAS,
    SUPERSEDED,
    UNCOMMITTED,
    StoreLayout,
    utc_now,
    validate_iteration,
    validate_stage,
)
from storage.lock import RunLock
from storage.run_record import read_status
from storage.schemas import STAGES_TABLE, TABLE_SCHEMAS, conform


class RunWriter:
    """Write access to one run, holding its lock until `close()` / the end of the with-block."""

    def __init__(self, layout: StoreLayout, run_id: str, lock: RunLock) -> None:
        self.layout = layout
        self.run_id = run_id
        self._lock: RunLock | None = lock

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Release the run lock (idempotent)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _check_open(self) -> None:
        if self._lock is None:
            raise StoreError(f"the writer of run {self.run_id!r} is closed")

    def is_committed(self, iteration: int, stage: str) -> bool:
        """Whether stage `stage` of `iteration` has a commit record (the caller then skips it)."""
        return self.committed_attempt(iteration, stage) > 0

    def stage(self, iteration: int, stage: str, *, supersede: bool = False) -> StageAttempt:
        """A new attempt of `stage` in `iteration`; use as a context manager. `supersede`: the
        stage may already be committed, and this attempt's commit replaces that one for every
        reader (the older attempt's files move to attempts/superseded/, kept)."""
        self._check_open()
        return StageAttempt(
            self, validate_iteration(iteration), validate_stage(stage), supersede=supersede
        )

    def committed_attempt(self, iteration: int, stage: str) -> int:
        """The attempt number of the commit readers see for `stage` in `iteration` (the
        highest), or 0 when the stage is not committed."""
        validate_stage(stage)
        pdir = self.layout.partition_dir(STAGES_TABLE, self.run_id, validate_iteration(iteration))
        return max((attempt for _, _, attempt in stage_files(pdir, stage)), default=0)

    def set_status(self, status: str, **fields: Any) -> None:
        """Update runs/<run_id>/status.json (merged with the previous fields), atomically."""
        self._check_open()
        path = self.layout.run_dir(self.run_id) / "status.json"
        current = read_status(path) if path.exists() else {}
        current.update(fields, status=status, updated_at=utc_now().isoformat())
        atomic_write_text(path, json.dumps(current, default=str))


class StageAttempt:
    """One attempt of a stage: files written here are invisible until `commit()`."""

    def __init__(
        self, writer: RunWriter, iteration: int, stage: str, *, supersede: bool = False
    ) -> None:
        self.writer = writer
        self.iteration = iteration
        self.stage = stage
        self.supersede = supersede
        self._replaces = 0  # the committed attempt this one supersedes (0: none)
        self.attempt = 0
        self.info: dict[str, Any] = {}
        self.committed = False
        self._started_at: dt.datetime | None = None
        self._outputs: dict[str, int] = {}
        self._parts: dict[str, int] = {}

    @property
    def run_id(self) -> str:
        return self.writer.run_id

    def __enter__(self) -> StageAttempt:
        self.begin()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None and not self.committed:
            self.commit()

    def begin(self) -> None:
        """Refuse a committed stage (unless superseding it), remove earlier uncommitted
        attempts, pick the number."""
        self.writer._check_open()
        self._replaces = self.writer.committed_attempt(self.iteration, self.stage)
        if self._replaces and not self.supersede:
            raise StageAlreadyCommittedError(
                f"stage {self.stage!r} of iteration {self.iteration} of run {self.run_id!r} is "
                "already committed; check writer.is_committed() and skip it"
            )
        layout = self.writer.layout
        last = 0
        for table in TABLE_SCHEMAS:
            for area in AREAS:
                pdir = layout.partition_dir(table, self.run_id, self.iteration, area)
                for path, _, attempt in stage_files(pdir, self.stage):
                    last = max(last, attempt)
                    # Committed attempts (all of them, superseded ones included) stay.
                    if attempt > self._replaces and area != SUPERSEDED:
                        path.unlink(missing_ok=True)
                if pdir.is_dir():
                    for name in os.listdir(pdir):
                        if name.startswith(f"{TMP_PREFIX}{self.stage}-"):
                            (pdir / name).unlink(missing_ok=True)
        self.attempt = last + 1
        self._started_at = utc_now()

    def _check_writable(self) -> None:
        if self._started_at is None:
            raise StoreError("use the stage attempt as a context manager (or call begin())")
        if self.committed:
            raise StageAlreadyCommittedError(
                f"stage {self.stage!r} of iteration {self.iteration} is already committed"
            )

    def write(self, table: str, rows: pa.Table | Sequence[Mapping[str, Any]]) -> Path:
        """Validate `rows` against `table`'s schema and write them as one new file (under
        attempts/uncommitted/ until the commit)."""
        self._check_writable()
        if table == STAGES_TABLE:
            raise StoreError("the 'stages' table is written by commit(), not by write()")
        data = conform(table, rows, partition={"run_id": self.run_id, "iteration": self.iteration})
        part = self._parts.get(table, 0)
        self._parts[table] = part + 1
        suffix = f"-part{part}" if part else ""
        pdir = self.writer.layout.partition_dir(table, self.run_id, self.iteration, UNCOMMITTED)
        path = pdir / f"{self.stage}-{self.attempt}{suffix}.parquet"
        atomic_write_parquet(path, data)
        self._outputs[table] = self._outputs.get(table, 0) + data.num_rows
        return path

    def commit(self, info: Mapping[str, Any] | None = None) -> None:
        """Make this attempt's files visible: one atomic write of its `stages` row (the commit),
        then its files moved into tables/ and a superseded attempt's out (a kill between the
        two leaves moves that the run's next writer finishes, and readers follow the record)."""
        self._check_writable()
        if self.writer.committed_attempt(self.iteration, self.stage) != self._replaces:
            raise StageAlreadyCommittedError(
                f"stage {self.stage!r} of iteration {self.iteration} of run {self.run_id!r} "
                "was committed by another attempt"
            )
        if info:
            self.info.update(info)
        try:
            info_json = json.dumps(self.info, sort_keys=True)
        except TypeError as exc:
            raise StoreError(f"stage info must be JSON-serialisable: {exc}") from exc
        assert self._started_at is not None
        row = {
            "stage": self.stage,
            "attempt": self.attempt,
            "status": "committed",
            "started_at": self._started_at,
            "committed_at": utc_now(),
            "n_rows": sum(self._outputs.values()),
            "outputs": json.dumps(self._outputs, sort_keys=True),
            "info": info_json,
        }
        record = conform(STAGES_TABLE, [row], partition={})
        pdir = self.writer.layout.partition_dir(STAGES_TABLE, self.run_id, self.iteration)
        atomic_write_parquet(pdir / f"{self.stage}-{self.attempt}.parquet", record)
        self.committed = True
        layout = self.writer.layout
        publish(layout, self.run_id, self.iteration, self.stage, self.attempt)
        if self._replaces:
            retire(layout, self.run_id, self.iteration, self.stage, self.attempt)
