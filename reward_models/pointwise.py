"""The pointwise objective's side of the trainer: BCE-with-logits of the score at each read
position of an example against its label (the paper's ORM and PRM), and what every objective
reads and records of an example."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from grpo_core.contracts.errors import SettingError
from grpo_core.contracts.policy_batch import build_policy_batch
from reward_models.models import RewardModel
from reward_models.training import ObjectiveTraining, RMExample, TrainedRow, consecutive_batches


def check_examples(model: RewardModel, examples: Sequence[RMExample], max_length: int) -> None:
    """Raise when there is nothing to train on, an example is of another RM kind, or longer
    than reward_models.max_length in the RM's tokens (a SettingError naming the field)."""
    if not examples:
        raise ValueError("no reward-model training examples: label some rollouts first")
    for e in examples:
        if e.rm_kind != model.kind:
            raise ValueError(f"{e.rm_kind} example {e.problem_id} given to a {model.kind} model")
        length = example_tokens(e)
        if length > max_length:
            raise SettingError(
                f"example {e.problem_id}#{e.sample_index} has {length} tokens in the "
                f"{model.kind.upper()}'s tokenizer > reward_models.max_length {max_length}: "
                "raise max_length"
            )


def _read_positions(batch: Sequence[RMExample]) -> int:
    return sum(len(e.read_positions) for e in batch)


def _bce_loss(
    model: torch.nn.Module,
    batch: Sequence[RMExample],
    pad_id: int,
    device: torch.device,
    normaliser: int | None = None,
) -> Tensor:
    """Mean BCE-with-logits over every read position of the batch; with a `normaliser`, their
    sum divided by it."""
    picked = read_logits(model, batch, pad_id, device)
    targets = torch.tensor([t for e in batch for t in e.targets], device=picked.device)
    if normaliser is None:
        return F.binary_cross_entropy_with_logits(picked, targets)
    summed = F.binary_cross_entropy_with_logits(picked, targets, reduction="sum")
    return summed / normaliser


def read_logits(
    model: torch.nn.Module, batch: Sequence[RMExample], pad_id: int, device: torch.device
) -> Tensor:
    """The float32 logit at every read position of the batch's examples, in order."""
    policy_batch = build_policy_batch(
        [e.prompt_ids for e in batch], [e.completion_ids for e in batch], pad_id, "right"
    ).to(device)
    logits = model(policy_batch.input_ids, policy_batch.attention_mask, policy_batch.position_ids)
    rows = [r for r, e in enumerate(batch) for _ in e.read_positions]
    cols = [len(e.prompt_ids) + p for e in batch for p in e.read_positions]
    picked: Tensor = logits[torch.tensor(rows), torch.tensor(cols)].float()
    return picked


def example_tokens(example: RMExample) -> int:
    """Prompt + completion tokens: the example's width in a padded forward pass."""
    return len(example.prompt_ids) + len(example.completion_ids)


def _one_sequence(example: RMExample) -> tuple[int, int]:
    return 1, example_tokens(example)


def _example_counts(examples: Sequence[RMExample]) -> dict[str, float]:
    return {
        "examples": float(len(examples)),
        "targets": float(sum(len(e.targets) for e in examples)),
        "examples_new": float(sum(e.source == "new" for e in examples)),
        "examples_replay": float(sum(e.source == "replay" for e in examples)),
    }


def trained_rows(batch: Sequence[RMExample], epoch: int) -> list[TrainedRow]:
    """The rm_train rows of a batch of examples: one per target."""
    return [
        TrainedRow(
            e.rm_kind,
            e.problem_id,
            e.sample_index,
            None if e.step_indices is None else e.step_indices[j],
            target,
            e.source,
            e.origin_iteration,
            epoch,
            e.source_table,
        )
        for e in batch
        for j, target in enumerate(e.targets)
    ]


POINTWISE_TRAINING: ObjectiveTraining[RMExample] = ObjectiveTraining(
    check=check_examples,
    batches=consecutive_batches,
    terms=_read_positions,
    shape=_one_sequence,
    loss=_bce_loss,
    records=trained_rows,
    counts=_example_counts,
)
