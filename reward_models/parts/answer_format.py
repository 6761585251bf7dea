"""The format part: 1 when the output ends with one `#### <answer>` line, else 0."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grpo_core.data.answers import format_reward
from reward_models.parts.base import RewardPart, ScoringContext


def format_scores(context: ScoringContext, options: Mapping[str, Any]) -> list[float]:
    return [format_reward(text) for text in context.texts]


PART = RewardPart(
    name="format",
    score=format_scores,
    description="Weight of the format reward: 1 if a '#### x' line ends the output (>= 0).",
    always=True,
)
