"""Ctrl-C handling in-process: the first SIGINT asks for a stop at the next safe point, a
second one stops at once, and no SIGINT is lost or turned into a traceback while the run is
already stopping or while a log record is being written."""

from __future__ import annotations

import logging
import os
import signal
import threading

import pytest

from flows.interrupts import INTERRUPT, RunInterrupted, graceful_sigint

pytestmark = pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(),
    reason="signal handlers are installed from the main thread only",
)


def ctrl_c() -> None:
    """Deliver SIGINT to this process; Python runs the handler before the next bytecode."""
    os.kill(os.getpid(), signal.SIGINT)


def test_the_first_ctrl_c_only_asks_and_the_next_safe_point_stops() -> None:
    with graceful_sigint():
        INTERRUPT.check()  # nothing asked yet
        ctrl_c()
        assert INTERRUPT.requested
        with pytest.raises(RunInterrupted, match="at a safe point"):
            INTERRUPT.check()


def test_a_second_ctrl_c_stops_at_once() -> None:
    with graceful_sigint(), pytest.raises(RunInterrupted, match="second SIGINT"):
        ctrl_c()
        ctrl_c()


def test_a_ctrl_c_while_the_run_is_already_stopping_does_not_cut_its_clean_up_short() -> None:
    cleaned_up = False
    with graceful_sigint():
        ctrl_c()
        try:
            INTERRUPT.check()
        except RunInterrupted:
            ctrl_c()  # impatient, while the run records its status
            cleaned_up = True
        # a third one means it: the clean-up may be hanging
        with pytest.raises(KeyboardInterrupt):
            ctrl_c()
    assert cleaned_up


class _CtrlCWhileEmitting(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        ctrl_c()
        self.emitted = record.getMessage()


def test_a_second_ctrl_c_inside_logging_output_stops_at_the_next_safe_point_silently(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logger = logging.getLogger("itergrpo.test_interrupts")
    handler = _CtrlCWhileEmitting()
    logger.addHandler(handler)
    try:
        with graceful_sigint():
            ctrl_c()
            # logging would swallow an exception raised in emit and print "Logging error"
            logger.warning("a progress line")
            assert handler.emitted == "a progress line"
            with pytest.raises(RunInterrupted):
                INTERRUPT.check()
    finally:
        logger.removeHandler(handler)
    assert "Logging error" not in capsys.readouterr().err


def test_a_nested_block_keeps_the_outer_request_and_handler() -> None:
    before = signal.getsignal(signal.SIGINT)
    with graceful_sigint():
        outer = signal.getsignal(signal.SIGINT)
        ctrl_c()  # between two arms of an ablation
        with graceful_sigint():  # the next arm's run starts
            assert INTERRUPT.requested
        assert signal.getsignal(signal.SIGINT) is outer
        with pytest.raises(RunInterrupted):
            INTERRUPT.check()
    assert signal.getsignal(signal.SIGINT) is before
    with graceful_sigint():  # a new run starts with a clean flag
        assert not INTERRUPT.requested and not INTERRUPT.stopping
