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
