"""The run store: append-only hive-partitioned Parquet tables, a stage commit log, run registry.

Layout under the root:
    tables/<table>/run_id=<id>/iteration=<k>/<stage>-<attempt>[-part<n>].parquet
    tables/stages/run_id=<id>/iteration=<k>/<stage>-<attempt>.parquet   (the commit record)
    attempts/uncommitted/..., attempts/superseded/...   (the same tree, for other attempts)
    runs/<run_id>/config.yaml, status.json, lock
A data file is visible to readers only once its attempt's commit record exists. A stage has one
commit, except where a later attempt superseded it (RunWriter.stage(..., supersede=True), e.g.
an ablation's table rewritten with more seeds): readers then see the highest committed attempt
only, and the superseded one's files move to attempts/superseded/. Readers here follow the
commit records, so stores of earlier versions (every attempt under tables/) read the same.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import yaml

from storage.atomic import atomic_write_bytes, atomic_write_text
from storage.attempts import commits, data_files, tidy_run
from storage.errors import (
    ConfigMismatchError,
    DamagedRunRecordError,
    StoreError,
    StorePathError,
)
from storage.layout import (
    COMMITTED,
    DEFAULT_ROOT,
    RUN_ID_RE,
    STORE_ENTRIES,
    STORE_ENV,
    UNCOMMITTED,
    StoreLayout,
    utc_now,
    validate_run_id,
)
from storage.lock import acquire_lock, check_unlocked, lock_is_held
from storage.run_record import read_config, read_status
from storage.run_writer import RunWriter
from storage.scan import (
    RELISTS,
    present_columns,
    quote_ident,
    resolve_corrupt,
    table_select_sql,
)
from storage.schemas import STAGES_TABLE, table_schema


def _flat(config: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(config, Mapping):
        out: dict[str, Any] = {}
        for key, value in config.items():
            out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
        return out or {prefix: {}}
    return {prefix: config}


def config_diff(old: Any, new: Any) -> list[str]:
    """Dotted keys whose values differ between config trees `old` and `new`."""
    a, b = _flat(old), _flat(new)
    return [k for k in dict.fromkeys([*a, *b]) if a.get(k, ...) != b.get(k, ...)]


# Which stages read a config key (dotted): a set of stage names, or None for every stage.
StageReaders = Callable[[str], frozenset[str] | None]


def _keys_read_by_committed(
    diff: list[str], committed: set[str], readers: StageReaders | None
) -> list[str]:
    """The differing keys some committed stage read (all of them without `readers`, none when
    nothing is committed): a key only stages not yet committed read cannot make the run
    differ from a clean run with the new config, so only these keys refuse a rerun."""
    if not committed:
        return []
    if readers is None:
        return diff
    clashing = []
    for key in diff:
        read_by = readers(key)
        if read_by is None or read_by & committed:
            clashing.append(key)
    return clashing


def resolve_store_root(given: str | Path | None = None, configured: str | None = None) -> Path:
    """The store a command uses: `given` (--store), then $ITERGRPO_STORE, then `configured`
    (a config's store.root), then ./itergrpo-store; absolute, symlinks kept as spelled.

    One rule for every command (run, resume, sql, runs, tables, report, serve). An empty
    string counts as not given; a run's config records the root this returns, but the root
    is never compared on resume, so a store may be moved, restored or reached by a link.
    """
    for raw in (given, os.environ.get(STORE_ENV), configured):
        if raw is not None and str(raw).strip():
            return Path(raw).expanduser().absolute()
    return Path(DEFAULT_ROOT).absolute()


class RunStore(StoreLayout):
    """A store root. Reading needs no lock; writing goes through `open_run`."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = resolve_store_root(root)
        if self.root.exists() and not self.root.is_dir():
            raise StorePathError(
                f"store path {self.root} is a file, not a directory; pass another --store "
                f"or set {STORE_ENV}"
            )

    def require_existing(self) -> RunStore:
        """Self, or StoreError if nothing is stored at the root (a typo'd --store would
        otherwise read as an empty store)."""
        if not self.runs_dir.is_dir():
            raise StoreError(
                f"no itergrpo store at {self.root}: pass --store DIR or set {STORE_ENV} (runs "
                f"write to {DEFAULT_ROOT} unless told otherwise)"
            )
        return self

    def __repr__(self) -> str:
        return f"RunStore({str(self.root)!r})"

    # ---- writing -------------------------------------------------------------------------

    def _check_is_a_store(self) -> None:
        """Refuse a non-empty folder of other files; check the store (or where it would be
        created) is writable. Writes nothing."""
        if self.root.is_dir() and not self._looks_like_a_store():
            raise StorePathError(
                f"{self.root} holds other files and is not an itergrpo store; pass a new or "
                f"empty directory as --store (or {STORE_ENV})"
            )
        existing = next(p for p in (self.root, *self.root.parents) if p.exists())
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            raise StorePathError(
                f"cannot create or write the store at {self.root} ({existing} is not a writable "
                f"directory); pass another --store or set {STORE_ENV}"
            )

    def _check_writable(self) -> None:
        self._check_is_a_store()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorePathError(f"cannot create store directory {self.root}: {exc}") from exc
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise StorePathError(
                f"store directory {self.root} is not writable; pass another --store or set "
                f"{STORE_ENV}"
            )

    def _looks_like_a_store(self) -> bool:
        """Empty, or holding what a store holds (writing into someone's home folder is a typo)."""
        names = {p.name for p in self.root.iterdir()}
        return not names or bool(names & STORE_ENTRIES)

    def open_run(
        self,
        run_id: str,
        config: Mapping[str, Any],
        *,
        force_config: bool = False,
        upgrade_config: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        stage_readers: StageReaders | None = None,
    ) -> RunWriter:
        """Lock `run_id` for writing and record (or check) its config; use as a context manager.

        `upgrade_config` maps the stored config to the caller's current form before the two
        are compared (e.g. fills defaults of fields added since the run started); when they
        then agree, the stored config is rewritten in that form (the old file is kept).
        `stage_readers` names the stages that read a config key: a key no committed stage read
        may differ (the rerun takes the new config, the old one is kept beside it); without
        it any difference in a run with a committed stage is refused.
        """
        validate_run_id(run_id)
        self._check_writable()
        run_dir = self.run_dir(run_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = acquire_lock(run_dir / "lock", run_id)
        try:
            tidy_run(self, run_id)
            self._record_config(run_id, dict(config), force_config, upgrade_config, stage_readers)
            if not (run_dir / "status.json").exists():
                now = utc_now().isoformat()
                status: dict[str, Any] = {
                    "status": "created",
                    "iterations_done": 0,
                    "created_at": now,
                }
                status["updated_at"] = now
                atomic_write_text(run_dir / "status.json", json.dumps(status))
        except BaseException:
            lock.release()
            raise
        return RunWriter(self, run_id, lock)

    def check_can_open(
        self,
        run_id: str,
        config: Mapping[str, Any],
        *,
        force_config: bool = False,
        upgrade_config: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        stage_readers: StageReaders | None = None,
    ) -> None:
        """Raise what `open_run` would (bad run id, unusable store, a different config, a live
        lock holder) without creating or writing anything: a pre-flight check."""
        validate_run_id(run_id)
        self._check_is_a_store()
        run_dir = self.run_dir(run_id)
        if not run_dir.is_dir():
            return
        if not force_config:
            self._config_difference(run_id, dict(config), upgrade_config, stage_readers)
        if (run_dir / "status.json").exists():
            read_status(run_dir / "status.json")  # a damaged one is refused before any write
        check_unlocked(run_dir / "lock", run_id)

    def _config_difference(
        self,
        run_id: str,
        config: dict[str, Any],
        upgrade: Callable[[dict[str, Any]], dict[str, Any]] | None,
        readers: StageReaders | None = None,
        *,
        force: bool = False,
    ) -> bool:
        """Whether the stored config must be rewritten as `config` (it differs only in form,
        or `force`, or in keys no committed stage read); ConfigMismatchError on a difference
        in a key a committed stage read, unless forced."""
        path = self.run_dir(run_id) / "config.yaml"
        if not path.exists():
            return False
        stored = read_config(path)
        old = upgrade(stored) if upgrade is not None else stored
        diff = config_diff(old, yaml.safe_load(yaml.safe_dump(config)) or {})
        # A run that failed before its first commit, or in a stage that alone reads the keys
        # corrected, has nothing to keep consistent with: its rerun takes the new config (the
        # old one is kept beside it).
        committed = {str(r["stage"]) for r in self.committed_stages(run_id)} if diff else set()
        clashing = _keys_read_by_committed(diff, committed, readers)
        if clashing and not force:
            shown = ", ".join(clashing[:5])
            shown += f" (+{len(clashing) - 5} more)" if len(clashing) > 5 else ""
            raise ConfigMismatchError(
                f"run {run_id!r} was started with a different config (differing keys: "
                f"{shown}, read by committed stages); use a new run id, or `itergrpo run "
                "--force-config` to replace it (the old config is kept beside it)",
                clashing,
            )
        return bool(diff or config_diff(stored, old))

    def _record_config(
        self,
        run_id: str,
        config: dict[str, Any],
        force: bool,
        upgrade: Callable[[dict[str, Any]], dict[str, Any]] | None,
        readers: StageReaders | None,
    ) -> None:
        path = self.run_dir(run_id) / "config.yaml"
        text = yaml.safe_dump(config, sort_keys=False, allow_unicode=True)
        if not path.exists():
            atomic_write_text(path, text)
            return
        try:
            changed = self._config_difference(run_id, config, upgrade, readers, force=force)
        except DamagedRunRecordError:
            if not force:
                raise
            changed = True  # replaced on request; the damaged file is kept beside, as it was
        if not changed:
            return
        stamp = utc_now().strftime("%Y%m%dT%H%M%S%fZ")
        atomic_write_bytes(path.with_name(f"config.{stamp}.yaml"), path.read_bytes())
        atomic_write_text(path, text)

    # ---- listing -------------------------------------------------------------------------

    def committed_files(
        self,
        table: str,
        *,
        run_id: str | None = None,
        iterations: Iterable[int] | None = None,
        stage: str | None = None,
    ) -> list[Path]:
        """Paths of the files of `table` that belong to committed stage attempts (of `stage`
        only, when given), in path order; a committed attempt's files still under
        attempts/uncommitted/ (a kill between its commit and their move) count too."""
        its = None if iterations is None else list(iterations)
        committed = commits(self, run_id, its)
        files = [
            f
            for area in (COMMITTED, UNCOMMITTED)
            for f in data_files(self, table, run_id=run_id, iterations=its, area=area)
            if (f.run_id, f.iteration, f.stage, f.attempt) in committed
            and (stage is None or f.stage == stage)
        ]
        files.sort(key=lambda f: (f.run_id, f.iteration, f.stage, f.attempt, f.part))
        return [f.path for f in files]

    # ---- reading -------------------------------------------------------------------------

    def read(
        self,
        table: str,
        *,
        run_id: str | None = None,
        iterations: Iterable[int] | None = None,
        columns: Sequence[str] | None = None,
        where: str | None = None,
        stage: str | None = None,
    ) -> pa.Table:
        """Committed rows of `table`, typed as TABLE_SCHEMAS says; `where` is a SQL condition,
        `stage` keeps the rows that stage wrote (tables without a stage column too)."""
        schema = table_schema(table)
        cols = list(columns) if columns is not None else schema.names
        unknown = [c for c in cols if c not in schema.names]
        if unknown:
            raise StoreError(
                f"table {table!r} has no column(s) {unknown}; its columns are: "
                f"{', '.join(schema.names)}"
            )
        out_schema = pa.schema([schema.field(c) for c in cols])
        its = None if iterations is None else list(iterations)
        files = self.committed_files(table, run_id=run_id, iterations=its, stage=stage)
        con = duckdb.connect(":memory:")
        try:
            relists = 0
            while True:
                try:
                    source = table_select_sql(table, files, present_columns(con, files))
                    sql = f"SELECT {', '.join(quote_ident(c) for c in cols)} FROM ({source})"
                    if where:
                        sql += f" WHERE {where}"
                    result = con.sql(sql).to_arrow_table()
                    break
                except (duckdb.IOException, duckdb.InvalidInputException) as exc:
                    if relists < RELISTS and any(not f.exists() for f in files):
                        relists += 1  # a writer committed meanwhile and moved files
                        files = self.committed_files(
                            table, run_id=run_id, iterations=its, stage=stage
                        )
                    else:
                        files = resolve_corrupt(files, exc, skip=False)
        finally:
            con.close()
        return result.cast(out_schema)

    def committed_stages(self, run_id: str) -> list[dict[str, Any]]:
        """The commit log of `run_id`, one dict per committed stage, in commit order."""
        rows = self.read(STAGES_TABLE, run_id=validate_run_id(run_id)).to_pylist()
        for row in rows:
            row["outputs"] = json.loads(row["outputs"])
            row["info"] = json.loads(row["info"])
        return sorted(rows, key=lambda r: (r["committed_at"], r["iteration"]))

    def run_ids(self) -> list[str]:
        if not self.runs_dir.is_dir():
            return []
        return sorted(
            p.name for p in self.runs_dir.iterdir() if p.is_dir() and RUN_ID_RE.match(p.name)
        )

    def run_status(self, run_id: str) -> dict[str, Any]:
        path = self.run_dir(run_id) / "status.json"
        if not path.exists():
            raise StoreError(f"no run {run_id!r} in store {self.root}")
        return read_status(path)

    def runs(self) -> list[dict[str, Any]]:
        """One dict per run: run_id, status, iterations_done, created_at, updated_at, ..."""
        out = []
        for rid in self.run_ids():
            try:
                status = self.run_status(rid)
            except DamagedRunRecordError as exc:  # the table still lists it; the line says why
                status = {"status": "damaged", "damage": str(exc)}
            except StoreError:
                status = {"status": "unknown"}
            if status.get("status") == "running" and not lock_is_held(self.run_dir(rid) / "lock"):
                # killed (-9, power loss) before it could record anything: resumable
                status["status"] = "interrupted (stale)"
            out.append({"run_id": rid, **status})
        return out

    def run_config(self, run_id: str) -> dict[str, Any]:
        """The config `run_id` was started with."""
        path = self.run_dir(run_id) / "config.yaml"
        if not path.exists():
            raise StoreError(f"no run {run_id!r} in store {self.root} (missing {path})")
        return read_config(path)
