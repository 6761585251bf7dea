"""Readable progress: bars only on a terminal, one plain line per interval elsewhere, and
metrics rounded in log lines."""

from __future__ import annotations

import io
import logging

import pytest
from tqdm.auto import tqdm

from grpo_core.contracts.progress import PlainProgress, progress_bar, rounded


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_rounded_drops_float_noise_and_keeps_whole_numbers() -> None:
    metrics = {"loss": 0.6931471805599453, "steps": 12.0, "n": 3, "auroc": 0.75, "tag": "x"}
    assert rounded(metrics) == "loss=0.6931 steps=12 n=3 auroc=0.75 tag=x"
    assert rounded({"lr": 1.23456e-05}) == "lr=1.235e-05"
    assert rounded({"flag": True}) == "flag=True"


def test_plain_progress_logs_once_per_interval_and_at_the_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    bar = PlainProgress(10, "rollout", "seq", interval=30.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="itergrpo"):
        for second in (10, 20, 31, 40, 50, 62, 70):  # crosses 30 s twice
            clock.now = second
            bar.update(1)
        bar.set_postfix(loss=0.123456)
        clock.now = 75
        bar.update(3)
        bar.close()
    assert [r.getMessage() for r in caplog.records] == [
        "rollout: 3/10 seq (30%)",
        "rollout: 6/10 seq (60%)",
        "rollout: 10/10 seq (100%) loss=0.1235",
    ]


def test_plain_progress_is_silent_for_a_loop_shorter_than_the_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    bar = PlainProgress(8, "evaluate", "seq", interval=30.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="itergrpo"):
        clock.now = 2
        bar.update(8)
        bar.close()
    assert caplog.records == []


def test_plain_progress_does_not_repeat_its_last_line_on_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    bar = PlainProgress(2, "train orm", "batch", interval=1.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="itergrpo"):
        clock.now = 5
        bar.update(2)
        bar.close()
    assert [r.getMessage() for r in caplog.records] == ["train orm: 2/2 batch (100%)"]


def test_a_terminal_gets_a_bar_a_file_gets_plain_lines_disabled_gets_nothing() -> None:
    assert isinstance(progress_bar(5, "x", "seq", stream=Terminal()), tqdm)
    assert isinstance(progress_bar(5, "x", "seq", stream=io.StringIO()), PlainProgress)
    off = progress_bar(5, "x", "seq", enabled=False, stream=Terminal())
    assert isinstance(off, tqdm) and off.disable
