"""A run's own record, runs/<run_id>/config.yaml, status.json and data.json (what its data was:
flows/data_identity.py): a file damaged by hand (or by a crash of another tool) is one error
naming the file and the fix, not a parser's traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from storage.atomic import atomic_write_bytes, atomic_write_text
from storage.errors import DamagedRunRecordError
from storage.layout import utc_now

DATA_RECORD = "data.json"

STATUS_FIX = (
    "restore it from a backup, or delete it: the next `itergrpo resume` writes a new one "
    "(committed stages are kept; `runs` shows the iterations again after the next evaluation)"
)
CONFIG_FIX = (
    "put back the config the run was started with (an earlier copy may sit beside it as "
    "config.<time>.yaml), or write it anew with `itergrpo run --config <that config> --run-id "
    "<id> --force-config` (the damaged file is kept beside it); the run cannot be resumed or "
    "checked without it"
)
DATA_FIX = (
    "restore it from a backup (an earlier copy may sit beside it as data.<time>.json), or "
    "delete it: the next start records the data as it is then, unchecked"
)


def _mapping(value: Any, path: Path, what: str, fix: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DamagedRunRecordError(
            f"damaged run record {path}: {what} holds a {type(value).__name__}, not a mapping; "
            f"{fix}"
        )
    return value


def _read_json_object(path: Path, fix: str) -> dict[str, Any]:
    """The JSON object in `path`; DamagedRunRecordError naming `fix` if it is not one."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DamagedRunRecordError(f"damaged run record {path}: not JSON ({exc}); {fix}") from None
    return _mapping(value, path, "the JSON", fix)


def read_status(path: Path) -> dict[str, Any]:
    """runs/<id>/status.json as a dict; DamagedRunRecordError if it is not a JSON object."""
    return _read_json_object(path, STATUS_FIX)


def read_config(path: Path) -> dict[str, Any]:
    """runs/<id>/config.yaml as a dict; DamagedRunRecordError if it is not a YAML mapping."""
    try:
        value = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        reason = " ".join(str(exc).split())  # PyYAML's message spans lines
        raise DamagedRunRecordError(
            f"damaged run record {path}: not YAML ({reason}); {CONFIG_FIX}"
        ) from None
    return _mapping(value, path, "the YAML", CONFIG_FIX)


def read_data_record(path: Path) -> dict[str, dict[str, Any]]:
    """runs/<id>/data.json: config key -> the fingerprint of the data it named, as recorded;
    DamagedRunRecordError if it is not a JSON object of objects."""
    record = _read_json_object(path, DATA_FIX)
    for key, entry in record.items():
        _mapping(entry, path, f"its entry {key!r}", DATA_FIX)
    return record


def write_data_record(path: Path, record: dict[str, dict[str, Any]]) -> None:
    """Write runs/<id>/data.json; a record it replaces is kept beside it as data.<time>.json."""
    if path.exists():
        stamp = utc_now().strftime("%Y%m%dT%H%M%S%fZ")
        atomic_write_bytes(path.with_name(f"data.{stamp}.json"), path.read_bytes())
    atomic_write_text(path, json.dumps(record, indent=1, sort_keys=True))
