"""Stopping a run at a safe point: Ctrl-C handling, the interrupt flag stages check, and
the fault injection the kill-and-resume tests drive."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from flows.progress import ProgressFn, log


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
