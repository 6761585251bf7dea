"""The verifier part: 1 when the output's final answer equals the gold answer, else 0. Every
step scores it (the yardstick of over-optimisation, and what the RFT estimators read)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grpo_core.algo.estimators import VERIFIER
from reward_models.parts.base import RewardPart, ScoringContext


def verifier_scores(context: ScoringContext, options: Mapping[str, Any]) -> list[float]:
    return [
        float(context.task.is_correct(problem, text))
        for problem, text in zip(context.problems, context.texts, strict=True)
    ]


PART = RewardPart(
    name=VERIFIER,
    score=verifier_scores,
    description="Weight of the verifier's 1/0 correctness of the final answer (>= 0).",
    default_weight=1.0,
    always=True,
)
