"""The format part: 1 when the output ends stating one final answer in the task's answer
format (`#### <answer>`, or a closing `\\boxed{}`), else 0."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reward_models.parts.base import RewardPart, ScoringContext


def format_scores(context: ScoringContext, options: Mapping[str, Any]) -> list[float]:
    return [context.task.answer_format.ends_with_answer(text) for text in context.texts]


PART = RewardPart(
    name="format",
    score=format_scores,
    description="Weight of the format reward: 1 if the output ends stating one final answer "
    "in the task's answer format ('#### x', or a last \\boxed{x}) (>= 0).",
    always=True,
)
