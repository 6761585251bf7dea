"""The length part (Kimi k1.5's length reward, Kimi Team 2025): within a group, the shortest
output gets +0.5 and the longest -0.5, linearly between; a wrong output's positive share is
withheld (a short wrong answer earns nothing), so the part pushes towards short correct
reasoning. Use it with its weight, grpo.rewards.length."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from reward_models.parts.base import RewardPart, ScoringContext


def length_reward(
    lengths: Sequence[int], correct: Sequence[bool], groups: Sequence[int]
) -> list[float]:
    """Per output: lambda = 0.5 - (len - min_len) / (max_len - min_len), min and max over the
    outputs of its group (`groups[r]`: output r's prompt); lambda if it is correct, else
    min(0, lambda). A group whose outputs are all as long gets 0 everywhere."""
    if not len(lengths) == len(correct) == len(groups):
        raise ValueError(
            f"need a length, a verdict and a group per output "
            f"(got {len(lengths)}, {len(correct)}, {len(groups)})"
        )
    shortest: dict[int, int] = {}
    longest: dict[int, int] = {}
    for n, g in zip(lengths, groups, strict=True):
        shortest[g] = min(shortest.get(g, n), n)
        longest[g] = max(longest.get(g, n), n)
    rewards = []
    for n, right, g in zip(lengths, correct, groups, strict=True):
        span = longest[g] - shortest[g]
        lam = 0.0 if span == 0 else 0.5 - (n - shortest[g]) / span
        rewards.append(lam if right else min(0.0, lam))
    return rewards


def length_scores(context: ScoringContext, options: Mapping[str, Any]) -> list[float]:
    correct = [
        context.task.is_correct(problem, text)
        for problem, text in zip(context.problems, context.texts, strict=True)
    ]
    lengths = [len(ids) for ids in context.batch.completion_ids]
    return length_reward(lengths, correct, context.batch.prompt_index)


PART = RewardPart(
    name="length",
    score=length_scores,
    description="Weight of Kimi k1.5's length reward (>= 0): within a group lambda = 0.5 - "
    "(len - min_len) / (max_len - min_len) in tokens; a correct output gets lambda, a wrong "
    "one min(0, lambda); equal lengths give 0.",
)
