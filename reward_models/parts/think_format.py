"""The R1 format part (DeepSeek-R1-Zero's format reward): 1 when the output opens with one
`<think>...</think>` block of reasoning and then states its answer in the task's answer
format, else 0. Use it with prompt.style: r1 and its own weight, grpo.rewards.think_format."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from reward_models.parts.base import RewardPart, ScoringContext

_THINK = re.compile(r"\s*<think>(?P<reasoning>.*?)</think>(?P<answer>.*)", re.DOTALL)


def think_format_score(text: str, ends_with_answer: Any) -> float:
    """1.0 for `<think> reasoning </think> answer` (one block, reasoning and answer not empty,
    the answer well formed by `ends_with_answer`), else 0.0."""
    match = _THINK.fullmatch(text)
    if match is None or "<think>" in match["answer"] or "</think>" in match["answer"]:
        return 0.0
    if not match["reasoning"].strip():
        return 0.0
    return float(ends_with_answer(match["answer"]))


def think_format_scores(context: ScoringContext, options: Mapping[str, Any]) -> list[float]:
    ends_with_answer = context.task.answer_format.ends_with_answer
    return [think_format_score(text, ends_with_answer) for text in context.texts]


PART = RewardPart(
    name="think_format",
    score=think_format_scores,
    description="Weight of the R1 format reward (>= 0): 1 if the output is one "
    "<think>...</think> block of reasoning, then the answer in the task's answer format.",
)
