"""The PRM's outcome part: its step probabilities folded into one score per output. (Rewards
per step are process supervision, grpo.algo.adv_estimator: grpo_process, not this part.)"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field

from reward_models.parts.base import RewardPart, ScoringContext

PrmAggregation = Literal["min", "mean", "last"]


def fold_step_scores(scores: Sequence[Sequence[float]], how: PrmAggregation) -> list[float]:
    """One outcome score per output from its PRM step probabilities: 'min' (a chain is as good
    as its weakest step), 'mean' or 'last'. An output without steps scores 0: it never answers."""
    if how not in ("min", "mean", "last"):
        raise ValueError(f"PRM aggregation must be 'min', 'mean' or 'last' (got {how!r})")

    def fold(s: Sequence[float]) -> float:
        return min(s) if how == "min" else sum(s) / len(s) if how == "mean" else s[-1]

    return [float(fold(s)) if s else 0.0 for s in scores]


def prm_scores(context: ScoringContext, options: Mapping[str, Any]) -> list[float]:
    return fold_step_scores(context.step_scores(), options["aggregation"])


PART = RewardPart(
    name="prm",
    score=prm_scores,
    description="Weight of the PRM's outcome score (>= 0): its step probabilities folded by "
    "prm_aggregation into one number per output. For step-level rewards use "
    "grpo.algo.adv_estimator: grpo_process instead.",
    needs=frozenset({"prm"}),
    learned=True,
    options={
        "aggregation": (
            PrmAggregation,
            Field(
                "min",
                description="How PRM step probabilities become one outcome score: 'min' (a "
                "solution is as good as its worst step; Lightman et al., Math-Shepherd), "
                "'mean', or 'last' (the final step's). An output without steps scores 0.",
            ),
        )
    },
)
