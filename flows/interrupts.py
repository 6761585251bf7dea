"""Stopping a run at a safe point: Ctrl-C handling, the interrupt flag stages check, and
the fault injection the kill-and-resume tests drive."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from flows.progress import ProgressFn, log
from grpo_core.contracts.errors import SettingError


class RunInterrupted(Exception):
    """Raised at a safe point after SIGINT, or at once on a second SIGINT; the run is
    resumable with `itergrpo resume` (a stage stopped midway commits nothing)."""


class _InterruptFlag:
    def __init__(self) -> None:
        self.requested = False
        # Set once a RunInterrupted is on its way up: the run is already stopping.
        self.stopping = False
        self.depth = 0  # graceful_sigint blocks entered (only the outermost clears the flags)

    def check(self) -> None:
        if self.requested:
            self.stopping = True
            raise RunInterrupted(
                "interrupted by SIGINT at a safe point; resume with the same run id"
            )


INTERRUPT = _InterruptFlag()


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    if not INTERRUPT.requested:
        INTERRUPT.requested = True
        log.warning("SIGINT: stopping at the next safe point (Ctrl-C again to stop now)")
        return
    if INTERRUPT.stopping:
        # Already unwinding from the first Ctrl-C: a second exception now would cut short the
        # clean-up that records the run as interrupted. A further Ctrl-C (a clean-up that
        # hangs) raises KeyboardInterrupt.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        return
    if _inside_logging(frame):
        # logging swallows an exception raised inside a handler's emit (it prints a "Logging
        # error" traceback and goes on); the flag stops the run at the next safe point
        # instead, and a third Ctrl-C lands here again.
        return
    # Not a KeyboardInterrupt: the run is recorded `interrupted` and the CLI prints the resume
    # command; the uncommitted stage's files are discarded as usual.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    INTERRUPT.stopping = True
    raise RunInterrupted("interrupted by a second SIGINT; resume with the same run id")


def stopped_by_a_signal(exc: BaseException, stop_signals: tuple[type[BaseException], ...]) -> bool:
    """Whether `exc` ends the run as `interrupted` (resumable) rather than `failed`: a
    RunInterrupted, a KeyboardInterrupt, one of the engine's `stop_signals`, or any exception
    once a Ctrl-C's RunInterrupted was raised. The last covers a C extension that replaces what
    a signal handler raised inside it: DuckDB raises RuntimeError("Query interrupted")."""
    return isinstance(exc, (RunInterrupted, KeyboardInterrupt, *stop_signals)) or INTERRUPT.stopping


@contextmanager
def graceful_sigint() -> Iterator[None]:
    """First Ctrl-C asks the run to stop at the next safe point; a second one stops now.

    Nested uses (an ablation's arm runs inside the ablation's) share the outermost one's flag,
    so a Ctrl-C between two arms is not forgotten when the next arm starts."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if INTERRUPT.depth == 0:
        INTERRUPT.requested = False
        INTERRUPT.stopping = False
    signal.signal(signal.SIGINT, _on_sigint)
    INTERRUPT.depth += 1
    try:
        yield
    finally:
        INTERRUPT.depth -= 1
        signal.signal(signal.SIGINT, previous)


_LOGGING_DIR = os.path.dirname(logging.__file__)


def _inside_logging(frame: FrameType | None) -> bool:
    """Whether the signal interrupted code called from the logging package."""
    while frame is not None:
        if os.path.dirname(frame.f_code.co_filename) == _LOGGING_DIR:
            return True
        frame = frame.f_back
    return False


# Fault injection for the kill-and-resume and error-reporting tests: "SIGKILL@grpo:1:2" sends
# SIGKILL to this process at the 2nd progress report of the GRPO stage of iteration 1 (SIGINT
# likewise, "SIGINT*2@..." twice in a row); "ValueError@grpo:1:2" raises a ValueError there,
# as a bug in the stage would.
# Progress reports sit between a stage's work and its commit, so this hits "inside" a stage.
FAULT_ENV = "ITERGRPO_FAULT"
# The exceptions a fault may raise: the ones a bug usually raises.
FAULT_EXCEPTIONS: dict[str, type[Exception]] = {
    "ValueError": ValueError,
    "KeyError": KeyError,
    "RuntimeError": RuntimeError,
}


def with_fault_hook(progress: ProgressFn, stage: str, iteration: int) -> ProgressFn:
    """`progress`, plus what FAULT_ENV asks for at its stage/iteration/report:
    `SIGNAL@stage:iteration:n` to this process, `SIGNAL*2@...` twice in a row (an impatient
    second Ctrl-C), `SIGNAL-GROUP@...` to its whole process group (what a terminal's Ctrl-C
    does), or `ValueError@...` (FAULT_EXCEPTIONS) raised there."""
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return progress
    try:
        sig_name, where = spec.split("@")
        sig_name, _, repeat = sig_name.partition("*")
        times = int(repeat or 1)
        group = sig_name.endswith("-GROUP")
        sig_name = sig_name.removesuffix("-GROUP")
        want_stage, want_iteration, want_count = where.split(":")
        error = FAULT_EXCEPTIONS.get(sig_name)
        sig = None if error else signal.Signals[sig_name]
        count_at = int(want_count)
        target = (want_stage, int(want_iteration))
    except (ValueError, KeyError):
        raise SettingError(
            f"{FAULT_ENV}={spec!r}: expected SIGNAL[*times]@stage:iteration:n or "
            f"{'|'.join(FAULT_EXCEPTIONS)}@stage:iteration:n"
        ) from None
    if target != (stage, iteration):
        return progress
    calls = 0

    def hooked(fraction: float, message: str) -> None:
        nonlocal calls
        progress(fraction, message)
        calls += 1
        if calls == count_at:
            log.warning("%s: sending %s at %s", FAULT_ENV, spec.split("@")[0], where)
            if error is not None:
                raise error(f"injected by {FAULT_ENV}={spec}")
            assert sig is not None
            for _ in range(times):
                if group:
                    os.killpg(os.getpgrp(), sig)
                else:
                    os.kill(os.getpid(), sig)

    return hooked
