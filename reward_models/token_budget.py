"""Reward-model training items packed into forward/backward passes by a token budget
(reward_models.max_tokens_per_micro_batch): the plan, and the note for an item over it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

from grpo_core.algo.micro_batches import plan_passes

log = logging.getLogger(__name__)

Item = TypeVar("Item")

_BUDGETS_NOTED: set[int] = set()


def token_micro_batches(
    items: Sequence[Item], shape: Callable[[Item], tuple[int, int]], max_tokens: int
) -> list[list[Item]]:
    """Items sorted by their longest sequence, longest first (ties in order), cut greedily:
    a micro-batch takes the next item while its sequences x its first (longest) item's
    longest stay within `max_tokens`, the padded size of its forward pass. An item over the
    budget goes alone (the policy's planner, grpo_core/algo/micro_batches.py plan_passes)."""
    plan = plan_passes([shape(item) for item in items], max_tokens)
    return [[items[i] for i in rows] for rows in plan]


def note_items_over_budget(
    items: Sequence[Item], shape: Callable[[Item], tuple[int, int]], max_tokens: int
) -> None:
    """Log once per budget that an item padding to more than it runs alone, over the budget."""
    largest = max((rows * longest for rows, longest in map(shape, items)), default=0)
    if largest > max_tokens and max_tokens not in _BUDGETS_NOTED:
        _BUDGETS_NOTED.add(max_tokens)
        log.warning(
            "a reward-model training item pads to %d tokens (its sequences x its longest), "
            "more than reward_models.max_tokens_per_micro_batch = %d: it runs alone in its "
            "pass (raise the budget to bound memory by it)",
            largest,
            max_tokens,
        )
