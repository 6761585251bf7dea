"""Padding-free forwards (verl's use_remove_padding, TRL's padding_free): the rows of a
micro-batch concatenated into one row of their attended tokens, position ids restarting at 0
for each row, and no attention mask. transformers reads the restarts as sequence boundaries:
flash_attention_2/3 run varlen kernels over the sequences; sdpa and eager build a
block-diagonal causal mask over the whole packed row (masking_utils'
find_packed_sequence_indices), so their attention still computes the masked blocks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from grpo_core.contracts.policy_batch import PolicyBatch
from grpo_core.model.checkpointing import transformers_model

log = logging.getLogger(__name__)

# Architectures whose decoder passes position_ids to transformers' mask builders (and to the
# flash-attention varlen path), so a packed row's sequences never attend to each other.
PACKED_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})
# Attention implementations that separate packed sequences: varlen kernels, or a
# block-diagonal mask built from the position ids.
VARLEN_ATTENTION = frozenset({"flash_attention_2", "flash_attention_3"})
MASKED_ATTENTION = frozenset({"sdpa", "eager"})

_NOTED: set[str] = set()


def packing_refusal(model: nn.Module) -> str | None:
    """Why `model` (or the transformers model inside its wrapper: LoRA, DDP, DeepSpeed, a
    value head) cannot run packed rows, or None when it can."""
    inner = transformers_model(model)
    if inner is None:
        return f"{type(model).__name__} holds no transformers model"
    model_type = getattr(inner.config, "model_type", None)
    if model_type not in PACKED_MODEL_TYPES:
        return f"model type {model_type!r} is not one of {sorted(PACKED_MODEL_TYPES)}"
    attention = inner.config._attn_implementation
    if attention not in VARLEN_ATTENTION | MASKED_ATTENTION:
        return f"attention {attention!r} does not separate packed sequences"
    return None


def packs(model: nn.Module, asked: bool, role: str) -> bool:
    """Whether `role`'s forwards run packed: asked (grpo.algo.padding_free) and the model can.
    Logs once per role and reason why it cannot, or how its attention runs the packed row."""
    if not asked:
        return False
    refusal = packing_refusal(model)
    if refusal is not None:
        _note_once(
            f"{role}: {refusal}",
            logging.WARNING,
            "grpo.algo.padding_free: the %s runs padded micro-batches instead (%s)",
            role,
            refusal,
        )
        return False
    inner = transformers_model(model)
    assert inner is not None  # packing_refusal checked it
    attention = inner.config._attn_implementation
    if attention in MASKED_ATTENTION:
        _note_once(
            f"{role}: {attention}",
            logging.WARNING,
            "grpo.algo.padding_free: the %s's %s attention masks the packed row block-"
            "diagonally: no padding in the linear layers, but attention computes every "
            "(token, token) entry of the packed row, which grows with the square of the "
            "budget (bench/padding_share.py); policy.attn_implementation: flash_attention_2 "
            "(CUDA) runs each row alone",
            role,
            attention,
        )
    return True


def _note_once(key: str, level: int, message: str, *args: object) -> None:
    if key not in _NOTED:
        _NOTED.add(key)
        log.log(level, message, *args)


@dataclass(frozen=True)
class PackedRows:
    """The attended tokens of a (B, L) batch as one (1, N) row, rows in order, and where each
    packed token came from."""

    input_ids: Tensor  # (1, N) long
    position_ids: Tensor  # (1, N) long, 0 at each row's first token
    rows: Tensor  # (N,) the batch row of each packed token
    cols: Tensor  # (N,) its column there
    shape: tuple[int, int]  # (B, L)

    def __len__(self) -> int:
        return int(self.input_ids.shape[1])

    def model_inputs(self) -> dict[str, Tensor | bool]:
        """A causal LM's keyword arguments for the packed row: no attention mask (transformers
        finds the sequences from the position ids only when none is given) and no cache."""
        return {"input_ids": self.input_ids, "position_ids": self.position_ids, "use_cache": False}

    def unpack(self, values: Tensor) -> Tensor:
        """(N,) values of the packed tokens placed at their (B, L) positions, 0 elsewhere
        (differentiable)."""
        out = values.new_zeros(self.shape)
        return out.index_put((self.rows, self.cols), values)

    def shift_unpack(self, predictions: Tensor) -> Tensor:
        """(N - 1,) values read at packed token j for token j + 1 (next-token log-probs,
        values of the prefix) placed at token j + 1's (B, L) position; a row's first token
        gets 0, never its predecessor row's last reading."""
        shifted = nn.functional.pad(predictions, (1, 0))
        return self.unpack(torch.where(self.position_ids[0] > 0, shifted, 0.0))


def pack_rows(batch: PolicyBatch) -> PackedRows:
    """The batch's attended tokens packed into one row, each row's positions counted from 0
    (its tokens' positions in the padded batch, as build_policy_batch numbers them)."""
    attended = batch.attention_mask > 0
    rows, cols = attended.nonzero(as_tuple=True)  # row-major: each row's tokens in order
    positions = attended.long().cumsum(dim=-1) - 1
    return PackedRows(
        input_ids=batch.input_ids[rows, cols][None],
        position_ids=positions[rows, cols][None],
        rows=rows,
        cols=cols,
        shape=(batch.input_ids.shape[0], batch.input_ids.shape[1]),
    )
