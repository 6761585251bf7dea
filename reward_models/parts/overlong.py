"""The overlong part (DAPO's soft overlong punishment, Yu et al. 2025): no penalty up to
`max_new_tokens - cache`, then a penalty growing linearly to -1 at `max_new_tokens`, so an
output is told it is getting long before it is cut off. Use it with its weight,
grpo.rewards.overlong, and its cache, grpo.rewards.overlong_cache_fraction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field

from reward_models.parts.base import RewardPart, ScoringContext


def overlong_penalty(lengths: Sequence[int], max_len: int, cache: int) -> list[float]:
    """Per output of `lengths` tokens: 0 while length <= max_len - cache; (max_len - cache -
    length) / cache between there and max_len (from 0 down to -1); -1 beyond max_len. A cache
    of 0 penalises only outputs longer than max_len."""
    if max_len < 1 or not 0 <= cache <= max_len:
        raise ValueError(f"need max_len >= 1 and 0 <= cache <= max_len (got {max_len}, {cache})")
    start = max_len - cache
    return [0.0 if n <= start else -1.0 if n > max_len else (start - n) / cache for n in lengths]


def cache_tokens(max_new_tokens: int, fraction: float) -> int:
    """The soft-penalty interval in tokens: `fraction` of the completion budget, rounded."""
    return round(max_new_tokens * fraction)


def overlong_scores(context: ScoringContext, options: Mapping[str, Any]) -> list[float]:
    cache = cache_tokens(context.max_new_tokens, options["cache_fraction"])
    lengths = [len(ids) for ids in context.batch.completion_ids]
    return overlong_penalty(lengths, context.max_new_tokens, cache)


PART = RewardPart(
    name="overlong",
    score=overlong_scores,
    description="Weight of DAPO's overlong penalty (>= 0): 0 for an output up to "
    "max_new_tokens - cache tokens long, then falling linearly to -1 at max_new_tokens.",
    options={
        "cache_fraction": (
            float,
            Field(
                0.2,
                ge=0.0,
                le=1.0,
                description="The overlong penalty's soft interval as a fraction of "
                "grpo.max_new_tokens, from 0 to 1 (DAPO: 4096 of 20480 = 0.2); 0 penalises "
                "nothing an engine can sample (no output is longer than max_new_tokens).",
            ),
        )
    },
)
