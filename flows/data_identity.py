"""Which data a run is computed on: a fingerprint (flows/data_fingerprint.py) of each data file
or folder its task names (the task's registered `data_paths`) and of grpo.pairs_file, recorded
with the run as runs/<id>/data.json and checked whenever the run starts again or another run
forks it.

The rule is the one config keys follow (flows/config_readers.py): data that a committed stage
read may not change, since the run would then finish on other data than it started on; data no
committed stage read may (the rerun reads the new data and records it). `--force-config` takes
changed data as it takes a changed config. A run recorded before runs had fingerprints gets
its record at its next start, from the data as it is then.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from pathlib import Path

from flows.config import ItergrpoConfig
from flows.config_readers import stages_reading
from flows.data_fingerprint import Fingerprint, fingerprint
from flows.errors import DataChangedError
from grpo_core.data.tasks.base import TASKS
from storage.errors import DamagedRunRecordError
from storage.run_record import DATA_FIX, DATA_RECORD, read_data_record, write_data_record
from storage.store import RunStore

log = logging.getLogger(__name__)

# config key (task.local_files.path) -> what is there now; None: nothing is.
DataNow = dict[str, Fingerprint | None]


def data_locations(cfg: ItergrpoConfig) -> dict[str, Path]:
    """The data files or folders `cfg`'s task reads, and offline DPO's pairs file, by the
    config key that names each."""
    spec, section = TASKS[cfg.task.name], cfg.task.section()
    paths = {f"task.{spec.name}.{field}": getattr(section, field) for field in spec.data_paths}
    paths["grpo.pairs_file"] = cfg.grpo.pairs_file
    return {key: Path(value) for key, value in paths.items() if value}


def data_now(cfg: ItergrpoConfig) -> DataNow:
    """The fingerprint of each data file or folder `cfg` names, as it is now."""
    return {key: fingerprint(path) for key, path in data_locations(cfg).items()}


def recorded_data(store: RunStore, run_id: str) -> dict[str, Fingerprint] | None:
    """Run `run_id`'s data record; None when it has none (a new run, or one recorded before
    runs had fingerprints)."""
    path = store.run_dir(run_id) / DATA_RECORD
    if not path.exists():
        return None
    record = read_data_record(path)
    try:
        return {key: Fingerprint.from_record(entry) for key, entry in record.items()}
    except (TypeError, ValueError) as exc:
        raise DamagedRunRecordError(
            f"damaged run record {path}: not a data record ({exc}); {DATA_FIX}"
        ) from None


def _changed(recorded: Mapping[str, Fingerprint], now: DataNow) -> list[str]:
    """Keys whose data differs from the record (a key the config no longer names is the config
    comparison's business)."""
    return [
        key
        for key, then in recorded.items()
        if key in now and ((current := now[key]) is None or not then.same_data(current))
    ]


def _read_by(key: str, stages: Collection[str]) -> bool:
    readers = stages_reading(key)
    return bool(stages) if readers is None else bool(readers & set(stages))


def _refusal(
    recorded: Mapping[str, Fingerprint], now: DataNow, read: Collection[str], run_id: str
) -> str | None:
    """What of the data `read` (stage names) read has changed since run `run_id` recorded it;
    None: nothing."""
    clashing = [key for key in _changed(recorded, now) if _read_by(key, read)]
    since = f"run {run_id!r} read it"
    lines: list[str] = []
    for key in clashing:
        then, current = recorded[key], now[key]
        lines.append(
            f"{key} {then.path} is gone (it held {then.summary()} when {since})"
            if current is None
            else f"{key} {then.path} has changed since {since} ({then.summary()} then, "
            f"{current.summary()} now)"
        )
    return "; ".join(lines) or None


def check_data(store: RunStore, run_id: str, now: DataNow, *, force: bool = False) -> None:
    """Raise DataChangedError when data that a committed stage of `run_id` read differs from
    `now` (unless `force`); writes nothing."""
    recorded = recorded_data(store, run_id)
    if recorded is None or force or not _changed(recorded, now):
        return
    committed = {str(s["stage"]) for s in store.committed_stages(run_id)}
    what = _refusal(recorded, now, committed, run_id)
    if what:
        raise DataChangedError(
            f"run {run_id!r} was computed on other data: {what}. Restore the data the run "
            "started on, or start a new run (another run id) on the data as it is now"
        )


def record_data(store: RunStore, run_id: str, now: DataNow) -> None:
    """Record `now` as run `run_id`'s data when it differs from its record (the record it
    replaces is kept beside it); a run with committed stages and no record yet (started before
    runs had fingerprints) is recorded from its data as it is now, with a warning."""
    present = {key: fp for key, fp in now.items() if fp is not None}
    recorded = recorded_data(store, run_id)
    if recorded == present or (recorded is None and not present):
        return
    if recorded is None and store.committed_stages(run_id):
        log.warning(
            "run %s has no record of its data (it started before itergrpo recorded one): "
            "recorded %s as it is now; a later change to it is refused",
            run_id,
            ", ".join(f"{key} {fp.path}" for key, fp in present.items()),
        )
    record = {key: fp.as_record() for key, fp in present.items()}
    write_data_record(store.run_dir(run_id) / DATA_RECORD, record)


def check_fork_data(
    store: RunStore, source: str, target: str, now: DataNow, stages: Collection[str]
) -> None:
    """Raise DataChangedError when data that `stages` of run `source` read differs from `now`
    (run `target` would take those stages over); a source without a record is not checked."""
    recorded = recorded_data(store, source)
    what = _refusal(recorded, now, stages, source) if recorded is not None else None
    if what:
        raise DataChangedError(
            f"run {target!r} cannot take over run {source!r}'s stages, which were computed on "
            f"other data: {what}. Restore the data {source!r} was computed on, or start anew "
            "(another run or ablation id) on the data as it is now"
        )
