"""The ORM part: the outcome reward model's probability that the output is correct."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from reward_models.parts.base import RewardPart, ScoringContext

if TYPE_CHECKING:
    from torch import Tensor


def orm_scores(context: ScoringContext, options: Mapping[str, Any]) -> Tensor:
    return context.outcome_scores("orm")


PART = RewardPart(
    name="orm",
    score=orm_scores,
    description="Weight of the ORM probability that the output is correct (>= 0).",
    needs=frozenset({"orm"}),
    learned=True,
)
