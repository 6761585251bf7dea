"""How long loops report progress: a tqdm bar on a terminal, else (log files, Prefect, CI)
one plain log line per interval; and metrics as rounded `name=value` text for log lines."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TextIO

from tqdm.auto import tqdm

log = logging.getLogger("itergrpo")

# Seconds between two plain progress lines where no terminal redraws a bar in place.
PLAIN_INTERVAL_SECONDS = 30.0


class ProgressBar(Protocol):
    def update(self, n: int = 1) -> Any: ...
    def set_postfix(self, **values: Any) -> Any: ...
    def close(self) -> Any: ...


def rounded(metrics: Mapping[str, Any], digits: int = 4) -> str:
    """`metrics` as `name=value` pairs: whole numbers without decimals, other numbers to
    `digits` significant digits (not the 16 of a raw float)."""
    parts = []
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            parts.append(f"{name}={value}")
        elif float(value).is_integer():
            parts.append(f"{name}={int(value)}")
        else:
            parts.append(f"{name}={value:.{digits}g}")
    return " ".join(parts)


class PlainProgress:
    """A tqdm-shaped counter that logs `desc: done/total unit (pct%) postfix` at most once per
    `interval` seconds, and at the end of a loop that has logged (a loop shorter than the
    interval stays silent: the stage's own `done in` line reports it)."""

    def __init__(
        self,
        total: int,
        desc: str,
        unit: str,
        interval: float = PLAIN_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total, self.desc, self.unit, self.interval, self.clock = (
            total,
            desc,
            unit,
            interval,
            clock,
        )
        self.done, self.postfix, self.logged = 0, "", -1
        self.last = clock()

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.clock() - self.last >= self.interval:
            self._line()

    def set_postfix(self, **values: Any) -> None:
        self.postfix = rounded(values)

    def close(self) -> None:
        if self.logged >= 0 and self.logged != self.done:
            self._line()

    def _line(self) -> None:
        percent = 100 * self.done // max(1, self.total)
        tail = f" {self.postfix}" if self.postfix else ""
        log.info(
            "%s: %d/%d %s (%d%%)%s", self.desc, self.done, self.total, self.unit, percent, tail
        )
        self.logged, self.last = self.done, self.clock()


def progress_bar(
    total: int, desc: str, unit: str, *, enabled: bool = True, stream: TextIO | None = None
) -> ProgressBar:
    """A tqdm bar where `stream` (stderr) is a terminal, plain periodic log lines elsewhere,
    nothing when not `enabled`."""
    if not enabled:
        return tqdm(total=total, disable=True)
    out = sys.stderr if stream is None else stream
    if out.isatty():
        return tqdm(total=total, desc=desc, unit=unit, file=out)
    return PlainProgress(total, desc, unit)
