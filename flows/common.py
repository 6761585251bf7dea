"""Plumbing shared by the stages: stage names, seeds, checkpoint paths, devices, interrupts."""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Final

import torch

from flows.config import ItergrpoConfig
from storage.checkpoints import checkpoint_path

log = logging.getLogger("itergrpo")

# Stage names as they appear in the `stages` table and in Parquet file names.
WARM_START = "warm_start"
ROLLOUT = "rollout"
LABEL = "label"
TRAIN_RM = "train_rm"
GRPO = "grpo"
EVALUATE = "evaluate"
ITERATION_STAGES = (ROLLOUT, LABEL, TRAIN_RM, GRPO, EVALUATE)
EVAL_SPLIT: Final = "test"  # the held-out split every evaluation (policy and RMs) samples
TRAIN_SPLIT: Final = "train"  # the split rollouts, GRPO and so the reward models draw prompts from

# Checkpoint roles: checkpoints/<run_id>/<role>/iter-<k>/
POLICY = "policy"  # policy/iter-k is the policy that iteration k starts from (and its reference)
ORM: Final = "orm"
PRM: Final = "prm"
GRPO_PROGRESS = "grpo-progress"  # intra-stage resume point of the GRPO stage of iteration k

ProgressFn = Callable[[float, str], None]


def no_progress(fraction: float, message: str) -> None:
    """Default progress sink: the terminal already has tqdm bars."""


# Fault injection for the kill-and-resume tests: "SIGKILL@grpo:1:2" sends SIGKILL to this
# process at the 2nd progress report of the GRPO stage of iteration 1 (SIGINT likewise).
# Progress reports sit between a stage's work and its commit, so this hits "inside" a stage.
FAULT_ENV = "ITERGRPO_FAULT"


def with_fault_hook(progress: ProgressFn, stage: str, iteration: int) -> ProgressFn:
    """`progress`, plus the signal FAULT_ENV asks for at its stage/iteration/report:
    `SIGNAL@stage:iteration:n` to this process, `SIGNAL-GROUP@...` to its whole process group
    (what a terminal's Ctrl-C does)."""
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return progress
    try:
        sig_name, where = spec.split("@")
        group = sig_name.endswith("-GROUP")
        sig_name = sig_name.removesuffix("-GROUP")
        want_stage, want_iteration, want_count = where.split(":")
        sig = signal.Signals[sig_name]
        count_at = int(want_count)
        target = (want_stage, int(want_iteration))
    except (ValueError, KeyError):
        raise ValueError(f"{FAULT_ENV}={spec!r}: expected SIGNAL@stage:iteration:n") from None
    if target != (stage, iteration):
        return progress
    calls = 0

    def hooked(fraction: float, message: str) -> None:
        nonlocal calls
        progress(fraction, message)
        calls += 1
        if calls == count_at:
            log.warning("%s: sending %s at %s", FAULT_ENV, spec.split("@")[0], where)
            if group:
                os.killpg(os.getpgrp(), sig)
            else:
                os.kill(os.getpid(), sig)

    return hooked


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
        raise RuntimeError("run.device = cuda but no CUDA device is visible; use auto or cpu")
    if cfg.run.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.run.device)


def ckpt(cfg: ItergrpoConfig, run_id: str, role: str, iteration: int) -> Path:
    return checkpoint_path(cfg.store.resolved_root(), run_id, role, iteration)


def require_checkpoint(path: Path, what: str) -> Path:
    """A checkpoint an earlier committed stage must have written; never silently restart."""
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{what} checkpoint missing at {path}; the stage that writes it is committed but "
            "its output is gone. Restore the directory or start a new run id."
        )
    return path


class RunInterrupted(Exception):
    """Raised at a safe point after SIGINT; the run is resumable with `itergrpo resume`."""


class _InterruptFlag:
    def __init__(self) -> None:
        self.requested = False

    def check(self) -> None:
        if self.requested:
            raise RunInterrupted(
                "interrupted by SIGINT at a safe point; resume with the same run id"
            )


INTERRUPT = _InterruptFlag()


@contextmanager
def graceful_sigint() -> Iterator[None]:
    """First Ctrl-C asks the run to stop at the next safe point; a second one stops now."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum: int, frame: FrameType | None) -> None:
        if INTERRUPT.requested:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        INTERRUPT.requested = True
        log.warning("SIGINT: stopping at the next safe point (Ctrl-C again to stop now)")

    INTERRUPT.requested = False
    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
