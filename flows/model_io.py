"""Saving the run's models as checkpoints (atomic, HF `save_pretrained` format) and moving a
model to the run's device."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from reward_models.models import RewardModel
from storage.checkpoints import save_checkpoint


def save_model(
    path: Path,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    weights: dict[str, Tensor] | None = None,
) -> None:
    """Weights (safetensors) and tokenizer into a temp dir renamed into place; `weights`
    (the model's state_dict keys) replace its own, e.g. what a DeepSpeed engine holds."""

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True, state_dict=weights)
        tokenizer.save_pretrained(tmp)

    save_checkpoint(path, write, overwrite=True)


def save_reward_model(
    path: Path, model: RewardModel, weights: dict[str, Tensor] | None = None
) -> None:
    """A reward model, atomically like the policy (its own `save` writes in place);
    `weights` (keys of model.state_dict()) replace the model's own, e.g. from DeepSpeed."""

    def write(tmp: Path) -> None:
        model.save(tmp, state_dict=weights)

    save_checkpoint(path, write, overwrite=True)


def to_device(model: PreTrainedModel, device: torch.device) -> PreTrainedModel:
    """The model moved to `device` (typed: transformers wraps `.to`)."""
    cast(nn.Module, model).to(device)
    return model
