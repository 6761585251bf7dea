"""Reading a run's own record, runs/<run_id>/config.yaml and status.json: a file damaged by
hand (or by a crash of another tool) is one error naming the file and the fix, not a
parser's traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from storage.errors import DamagedRunRecordError

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


def _mapping(value: Any, path: Path, what: str, fix: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DamagedRunRecordError(
            f"damaged run record {path}: {what} holds a {type(value).__name__}, not a mapping; "
            f"{fix}"
        )
    return value


def read_status(path: Path) -> dict[str, Any]:
    """runs/<id>/status.json as a dict; DamagedRunRecordError if it is not a JSON object."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DamagedRunRecordError(
            f"damaged run record {path}: not JSON ({exc}); {STATUS_FIX}"
        ) from None
    return _mapping(value, path, "the JSON", STATUS_FIX)


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
