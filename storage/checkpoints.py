"""Checkpoint directories: `checkpoints/<run_id>/<role>/iter-<k>/`, written atomically.

Weights are Hugging Face `save_pretrained(..., safe_serialization=True)` output written by the
caller inside `save_checkpoint`; optimizer and RNG state go in `training_state.pt`, loaded with
`torch.load(weights_only=True)` so a checkpoint never unpickles arbitrary objects.
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from storage.atomic import (
    atomic_directory,
    atomic_write_bytes,
    atomic_write_text,
    fsync_dir,
    temp_sibling,
)
from storage.layout import validate_run_id

TRAINING_STATE_FILE = "training_state.pt"
EXTRA_FILE = "training_state.json"
_ROLE_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ITER_RE = re.compile(r"^iter-(\d+)$")


def checkpoint_path(root: str | Path, run_id: str, role: str, iteration: int) -> Path:
    """`<root>/checkpoints/<run_id>/<role>/iter-<k>/` (role e.g. 'policy', 'orm', 'prm')."""
    if not _ROLE_RE.match(role):
        raise ValueError(f"invalid checkpoint role {role!r}: use letters, digits, '_' or '-'")
    if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
        raise ValueError(f"iteration must be an int >= 0 (got {iteration!r})")
    return Path(root) / "checkpoints" / validate_run_id(run_id) / role / f"iter-{iteration}"


def checkpoints_of(root: str | Path, run_id: str, role: str) -> list[tuple[int, Path]]:
    """(iteration, folder) of each complete checkpoint of `role`, by iteration."""
    role_dir = checkpoint_path(root, run_id, role, 0).parent
    if not role_dir.is_dir():
        return []
    return sorted(
        (int(m[1]), p)
        for p in role_dir.iterdir()
        if p.is_dir() and (m := _ITER_RE.match(p.name)) is not None
    )


def latest_checkpoint(root: str | Path, run_id: str, role: str) -> Path | None:
    """The complete checkpoint of `role` with the highest iteration, None if there is none."""
    found = checkpoints_of(root, run_id, role)
    return found[-1][1] if found else None


def remove_checkpoint(path: Path) -> None:
    """Delete checkpoint folder `path`: renamed to a hidden temp name first, so a kill while
    deleting leaves no half checkpoint under its own name."""
    doomed = temp_sibling(path)
    os.replace(path, doomed)
    fsync_dir(path.parent)
    shutil.rmtree(doomed)


def save_checkpoint(
    final_dir: str | Path, write_fn: Callable[[Path], None], *, overwrite: bool = False
) -> Path:
    """Call `write_fn(tmp_dir)` and rename tmp_dir to `final_dir` only if it returns normally."""
    final = Path(final_dir)
    with atomic_directory(final, overwrite=overwrite) as tmp:
        write_fn(tmp)
    return final


def save_training_state(
    directory: str | Path,
    *,
    optimizer_state: dict[str, Any] | None,
    rng_state: dict[str, Any] | None,
    extra: dict[str, Any] | None = None,
) -> None:
    """Write optimizer/RNG state (tensors, plain containers) and `extra` (JSON) into `directory`."""
    out = Path(directory)
    buf = io.BytesIO()
    torch.save({"optimizer_state": optimizer_state, "rng_state": rng_state}, buf)
    atomic_write_bytes(out / TRAINING_STATE_FILE, buf.getvalue())
    atomic_write_text(out / EXTRA_FILE, json.dumps(extra or {}, sort_keys=True))


def load_training_state(directory: str | Path) -> dict[str, Any]:
    """{'optimizer_state', 'rng_state', 'extra'} as saved (CPU tensors, weights_only load)."""
    src = Path(directory)
    path = src / TRAINING_STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no training state in {src} (missing {TRAINING_STATE_FILE})")
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    extra_path = src / EXTRA_FILE
    state["extra"] = json.loads(extra_path.read_text()) if extra_path.is_file() else {}
    return state


def capture_rng_state() -> dict[str, Any]:
    """The state of python `random`, numpy's global RNG, torch CPU (and CUDA when present)."""
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore what `capture_rng_state` captured (CUDA only if both sides have it)."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": npy["bit_generator"],
            "state": {"key": npy["key"].numpy().astype(np.uint32), "pos": npy["pos"]},
            "has_gauss": npy["has_gauss"],
            "gauss": npy["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
