"""Guards against NaN and infinity: a non-finite reward, advantage, loss or metric stops the
step that made it, naming the quantity, where it arose and the likely cause, before anything
of that step is written or applied (the store never holds NaN or inf)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

from grpo_core.contracts.errors import UserError

# Likely causes, by where a non-finite value shows up first.
DIVERGED = (
    "the policy's weights have diverged (lower grpo.algo.lr, raise grpo.algo.beta) or its "
    "checkpoint is corrupt"
)
REWARD_SOURCE = (
    "a reward weight (grpo.rewards) or a reward model's output; see the train_rm metrics "
    "of this iteration"
)


class NonFiniteError(UserError, ValueError):
    """A quantity that must be a finite number is NaN or infinite."""


def _first_bad(values: Tensor | float | Iterable[float]) -> tuple[int, int, float] | None:
    """(count, first index, first value) of the non-finite entries, or None if all finite."""
    if isinstance(values, Tensor):
        flat = values.detach().reshape(-1)
        if flat.is_floating_point():
            bad = ~torch.isfinite(flat)
            if bool(bad.any()):
                index = int(bad.nonzero()[0, 0])
                return int(bad.sum()), index, float(flat[index])
        return None
    items = [float(values)] if isinstance(values, int | float) else [float(v) for v in values]
    found = [i for i, v in enumerate(items) if not math.isfinite(v)]
    return (len(found), found[0], items[found[0]]) if found else None


def require_finite(
    quantity: str, values: Tensor | float | Iterable[float], *, where: str, cause: str
) -> None:
    """Raise NonFiniteError naming `quantity`, `where` and `cause` if any value is NaN/inf."""
    bad = _first_bad(values)
    if bad is None:
        return
    count, index, value = bad
    raise NonFiniteError(
        f"{quantity} is {value} ({count} non-finite value(s), first at index {index}) at "
        f"{where}; likely cause: {cause}. Nothing of this step was written"
    )


def require_finite_metrics(metrics: Mapping[str, float], *, where: str, cause: str) -> None:
    """Every metric of a step finite (the first offender named)."""
    for name, value in metrics.items():
        require_finite(f"metric {name!r}", value, where=where, cause=cause)
