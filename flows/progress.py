"""How a run reports: the itergrpo logger and the progress callback stages call."""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger("itergrpo")
# The loggers of itergrpo's own lines (stage starts, GRPO steps, tables): INFO and up.
PACKAGE_LOGGERS = ("itergrpo", "flows", "grpo_core", "reward_models", "storage")

ProgressFn = Callable[[float, str], None]


def no_progress(fraction: float, message: str) -> None:
    """Default progress sink: the terminal already has tqdm bars."""


def iteration_label(iteration: int, iterations: int) -> str:
    """How log lines name an iteration: the store's number first (the `iteration` column,
    the stage records), then its place in the run, so neither reads as the other."""
    return f"iteration {iteration} ({iteration + 1} of {iterations})"
