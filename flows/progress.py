"""How a run reports: the itergrpo logger and the progress callback stages call."""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger("itergrpo")

ProgressFn = Callable[[float, str], None]


def no_progress(fraction: float, message: str) -> None:
    """Default progress sink: the terminal already has tqdm bars."""
