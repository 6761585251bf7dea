"""What every stage shares besides its own work: its result, metric rows, derived seeds,
the run's checkpoint paths, and the device and threads it computes on."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from flows.config import ItergrpoConfig
from flows.errors import ConfigError
from storage.checkpoints import checkpoint_path
from storage.errors import MissingCheckpointError


@dataclass
class StageResult:
    """What a stage reports back to the loop (and to the Prefect UI)."""

    stage: str
    iteration: int
    skipped: bool = False
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


def metric_rows(
    stage: str, values: dict[str, float], step: int | None = None
) -> list[dict[str, Any]]:
    """Rows of the `metrics` table for one stage (and GRPO step)."""
    return [
        {"stage": stage, "step": step, "name": name, "value": float(value)}
        for name, value in values.items()
    ]


def apply_threads(cfg: ItergrpoConfig) -> None:
    """torch CPU threads from run.num_threads (unset: torch's default)."""
    if cfg.run.num_threads:
        torch.set_num_threads(cfg.run.num_threads)


def set_deepspeed_accelerator(cfg: ItergrpoConfig) -> None:
    """DeepSpeed picks its accelerator once, when first imported (transformers may import it
    without DeepSpeed being used): name run.device's, so it neither guesses nor warns."""
    os.environ.setdefault("DS_ACCELERATOR", resolve_device(cfg).type)


def derive_seed(base: int, *parts: object) -> int:
    """A stable 31-bit seed for (base, iteration, stage, step...): same inputs, same seed."""
    digest = hashlib.sha256(repr((base, *parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def resolve_device(cfg: ItergrpoConfig) -> torch.device:
    if cfg.run.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run.device = cuda but no CUDA device is visible; use auto or cpu")
    if cfg.run.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.run.device)


def ckpt(cfg: ItergrpoConfig, run_id: str, role: str, iteration: int) -> Path:
    return checkpoint_path(cfg.store.resolved_root(), run_id, role, iteration)


def require_checkpoint(path: Path, what: str) -> Path:
    """A checkpoint an earlier committed stage must have written; never silently restart."""
    if not (path / "config.json").is_file():
        raise MissingCheckpointError(
            f"{what} checkpoint missing at {path}; the stage that writes it is committed but "
            "its output is gone. Restore the directory or start a new run id."
        )
    return path
