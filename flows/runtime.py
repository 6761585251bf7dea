"""The process side of a run: its device, CPU threads and derived seeds (leaf helpers shared
by the run context, the Ray shards and the launcher)."""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING

from flows.errors import ConfigError

if TYPE_CHECKING:
    import torch


def derive_seed(base: int, *parts: object) -> int:
    """A stable 31-bit seed for (base, iteration, stage, step...): same inputs, same seed."""
    digest = hashlib.sha256(repr((base, *parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def resolve_device(device: str) -> torch.device:
    """run.device as a torch device: auto is CUDA when one is visible, else the CPU."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run.device = cuda but no CUDA device is visible; use auto or cpu")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


# Caps run.num_threads in every process of a run that inherits it: for jobs (or test
# workers) sharing a machine's cores, each taking its share instead of all of them.
MAX_THREADS_ENV = "ITERGRPO_MAX_THREADS"


def thread_cap() -> int | None:
    """$ITERGRPO_MAX_THREADS as a positive int, None when unset or empty."""
    raw = os.environ.get(MAX_THREADS_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(
            f"{MAX_THREADS_ENV}={raw!r}: give a whole number of threads >= 1, or unset it"
        )
    return int(raw)


def apply_threads(num_threads: int | None) -> None:
    """torch CPU threads from run.num_threads (unset: torch's default), at most
    $ITERGRPO_MAX_THREADS when that is set. Oversubscribed cores cost far more than the
    threads' share: torch's OpenMP threads spin while they wait for each other."""
    cap = thread_cap()
    threads = num_threads if cap is None else min(num_threads or cap, cap)
    if threads:
        import torch

        torch.set_num_threads(threads)


def name_deepspeed_accelerator(device: str) -> None:
    """DeepSpeed picks its accelerator once, when first imported (transformers may import it
    without DeepSpeed being used): name run.device's, so it neither guesses nor warns."""
    os.environ.setdefault("DS_ACCELERATOR", resolve_device(device).type)
