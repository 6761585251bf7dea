"""What a stage reports back to the loop (and the Prefect UI), and its rows of `metrics`."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StageResult:
    """What a stage reports back to the loop (and to the Prefect UI)."""

    stage: str
    iteration: int
    skipped: bool = False
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)  # what the guards (flows/guards.py) found


def metric_rows(
    stage: str, values: dict[str, float], step: int | None = None
) -> list[dict[str, Any]]:
    """Rows of the `metrics` table for one stage (and GRPO step)."""
    return [
        {"stage": stage, "step": step, "name": name, "value": float(value)}
        for name, value in values.items()
    ]


def row_dicts(rows: Iterable[Any]) -> list[dict[str, Any]]:
    """Dataclass rows of scalar fields as dicts for the store, in field order: what
    dataclasses.asdict gives, without its recursive copy (10x faster on the 10-30k rows an RM
    stage records)."""
    return [dict(vars(row)) for row in rows]


def mean(values: Iterable[Any]) -> float:
    """The mean of `values`, NaN when there are none (a rate of nothing is undefined)."""
    vals = [float(v) for v in values]
    return sum(vals) / len(vals) if vals else math.nan
