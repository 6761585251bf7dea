"""Scoring API of the GRPO stage: outcome scores per output, step scores per reasoning step,
each read where the reward model's format reads it, in the RM's own tokens."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from grpo_core.contracts.copies import first_copies
from grpo_core.contracts.policy_batch import build_policy_batch
from reward_models.models import RewardModel
from reward_models.views import RMInput


@dataclass(frozen=True)
class StepScores:
    """Per output: the PRM probability of each step and the index (into the RM's tokens of
    the completion) of the token it was read at: the step's last token, or its marker."""

    scores: list[list[float]]
    step_end_tokens: list[list[int]]


def _read_scores(
    model: RewardModel,
    prompts: Sequence[str],
    completions: Sequence[str],
    batch_size: int,
    positions: Callable[[RMInput], list[int]],
) -> tuple[list[list[float]], list[list[int]]]:
    """Sigmoid of the RM's logits at `positions(input)` of each output's completion.

    Each distinct (prompt, completion) is scored once and its scores given to every copy: a
    small policy repeats itself (40-50% of a demo GRPO step's outputs are copies).
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 (got {batch_size})")
    pairs = list(zip(prompts, completions, strict=True))
    firsts, groups = first_copies(pairs)
    distinct = [pairs[i] for i in firsts]
    scores, reads = _read_distinct_scores(model, distinct, batch_size, positions)
    return [list(scores[g]) for g in groups], [list(reads[g]) for g in groups]


def _read_distinct_scores(
    model: RewardModel,
    pairs: Sequence[tuple[str, str]],
    batch_size: int,
    positions: Callable[[RMInput], list[int]],
) -> tuple[list[list[float]], list[list[int]]]:
    """_read_scores of (prompt, completion) pairs, in `batch_size` right-padded passes."""
    encoder = model.encoder
    encoded = [encoder.encode(p, c) for p, c in pairs]
    reads = [positions(e) for e in encoded]
    scores: list[list[float]] = []
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for start in range(0, len(encoded), batch_size):
                chunk = encoded[start : start + batch_size]
                batch = build_policy_batch(
                    [e.prompt_ids for e in chunk],
                    [e.completion_ids for e in chunk],
                    model.tokenizer.pad_token_id,
                    "right",
                ).to(model.device)
                probs = torch.sigmoid(
                    model(batch.input_ids, batch.attention_mask, batch.position_ids).float()
                ).cpu()
                for row, e in enumerate(chunk):
                    cols = [len(e.prompt_ids) + p for p in reads[start + row]]
                    scores.append(probs[row, cols].tolist())
    finally:
        model.train(was_training)
    return scores, reads


def score_outcome(
    model: RewardModel,
    prompts: Sequence[str],
    completions: Sequence[str],
    batch_size: int = 64,
) -> torch.Tensor:
    """RM probability that each output is correct, read at its outcome position (the last
    token, or the last step's marker); (N,) float32, CPU. An empty completion of a format
    without a marker is read at the last prompt token."""
    scores, _ = _read_scores(
        model, prompts, completions, batch_size, lambda e: [e.outcome_position]
    )
    return torch.tensor([s[0] for s in scores], dtype=torch.float32)


def score_steps(
    model: RewardModel,
    prompts: Sequence[str],
    completions: Sequence[str],
    batch_size: int = 64,
) -> StepScores:
    """PRM probability at each step of each output (no steps: empty lists)."""
    scores, ends = _read_scores(model, prompts, completions, batch_size, lambda e: e.step_positions)
    return StepScores(scores, ends)
