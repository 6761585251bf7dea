"""Loading and saving the run's models as checkpoints (atomic, HF `save_pretrained` format)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from flows.config import ItergrpoConfig
from flows.names import POLICY
from flows.stage_io import ckpt, require_checkpoint, resolve_device
from grpo_core.model.policy import load_policy
from reward_models.models import RewardModel
from storage.checkpoints import save_checkpoint
from storage.run_writer import RunWriter


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


def to_device(model: PreTrainedModel, cfg: ItergrpoConfig) -> PreTrainedModel:
    """The model moved to the run's device (typed: transformers wraps `.to`)."""
    cast(nn.Module, model).to(resolve_device(cfg))
    return model


def policy_at(
    cfg: ItergrpoConfig, run: RunWriter, k: int
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """policy_k (the policy iteration k starts from) on the run's device."""
    path = require_checkpoint(ckpt(cfg, run.run_id, POLICY, k), f"policy_{k}")
    model, tokenizer = load_policy(path)
    return to_device(model, cfg), tokenizer
