"""Scoring API of the GRPO stage: outcome scores per output, step scores per reasoning step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from transformers import PreTrainedTokenizerBase

from grpo_core.contracts.policy_batch import build_policy_batch
from grpo_core.data.reasoning_steps import step_end_token_indices
from reward_models.models import RewardModel
from reward_models.training import encode_pair


@dataclass(frozen=True)
class StepScores:
    """Per output: the PRM probability of each step and the index (into the completion's
    token ids) of the token where that step ends."""

    scores: list[list[float]]
    step_end_tokens: list[list[int]]


def _read_scores(
    model: RewardModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    completions: Sequence[str],
    batch_size: int,
    positions: Callable[[list[int]], list[int]],
) -> tuple[list[list[float]], list[list[int]]]:
    """Sigmoid of the RM logits at `positions(completion_ids)` of each output."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 (got {batch_size})")
    encoded = [encode_pair(tokenizer, p, c) for p, c in zip(prompts, completions, strict=True)]
    reads = [positions(c) for _, c in encoded]
    scores: list[list[float]] = []
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for start in range(0, len(encoded), batch_size):
                chunk = encoded[start : start + batch_size]
                batch = build_policy_batch(
                    [p for p, _ in chunk], [c for _, c in chunk], tokenizer.pad_token_id, "right"
                ).to(model.device)
                probs = torch.sigmoid(
                    model(batch.input_ids, batch.attention_mask, batch.position_ids).float()
                ).cpu()
                for row, (prompt_ids, _) in enumerate(chunk):
                    cols = [len(prompt_ids) + p for p in reads[start + row]]
                    scores.append(probs[row, cols].tolist())
    finally:
        model.train(was_training)
    return scores, reads


def score_outcome(
    model: RewardModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    completions: Sequence[str],
    batch_size: int = 64,
) -> torch.Tensor:
    """ORM probability that each output is correct, read at its last token; (N,) float32, CPU.

    An empty completion is read at the last prompt token.
    """
    scores, _ = _read_scores(
        model, tokenizer, prompts, completions, batch_size, lambda ids: [len(ids) - 1]
    )
    return torch.tensor([s[0] for s in scores], dtype=torch.float32)


def score_steps(
    model: RewardModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    completions: Sequence[str],
    batch_size: int = 64,
) -> StepScores:
    """PRM probability at each step-end token of each output (no steps: empty lists)."""
    scores, ends = _read_scores(
        model,
        tokenizer,
        prompts,
        completions,
        batch_size,
        lambda ids: step_end_token_indices(ids, cast(Any, tokenizer)),
    )
    return StepScores(scores, ends)
