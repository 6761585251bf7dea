"""Padded policy batches: prompt + completion rows, masks and response coordinates.

Masks come from the true lengths, never from comparing ids with the pad id, and position
ids count attended tokens only, so left and right padding give the log-probs of unpadded
forward passes (grpo_core/model/forward.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import Tensor

PaddingSide = Literal["left", "right"]


@dataclass(frozen=True)
class PolicyBatch:
    """B rows of prompt + completion, padded to length L; response_mask marks completions."""

    input_ids: Tensor  # (B, L) long
    attention_mask: Tensor  # (B, L) long, 1 on prompt and completion tokens
    position_ids: Tensor  # (B, L) long, cumsum(attention_mask) - 1, clamped at 0
    response_mask: Tensor  # (B, L) float, 1 on completion tokens only

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def response_lengths(self) -> Tensor:
        """Completion tokens per row; (B,) long."""
        return self.response_mask.sum(dim=-1).long()

    def select(self, rows: Tensor) -> PolicyBatch:
        """The sub-batch of the given row indices (columns unchanged)."""
        return PolicyBatch(
            self.input_ids[rows],
            self.attention_mask[rows],
            self.position_ids[rows],
            self.response_mask[rows],
        )

    def to(self, device: torch.device | str) -> PolicyBatch:
        """The batch on `device`."""
        return replace(
            self,
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            position_ids=self.position_ids.to(device),
            response_mask=self.response_mask.to(device),
        )

    def expand_per_sequence(self, values: Tensor) -> Tensor:
        """One value per row (B,) broadcast to that row's completion tokens; (B, L)."""
        return values.reshape(-1, 1).to(torch.float32) * self.response_mask

    def response_to_full(self, values: Tensor) -> Tensor:
        """(B, T) values of response token t of each row placed at its columns; (B, L)."""
        if values.shape[-1] == 0:
            return torch.zeros_like(self.response_mask)
        index = (self.response_mask.cumsum(dim=-1) - 1).clamp(0, values.shape[-1] - 1).long()
        gathered = values.to(torch.float32).gather(-1, index)
        return torch.where(self.response_mask > 0, gathered, torch.zeros_like(gathered))

    def full_to_response(self, values: Tensor) -> Tensor:
        """(B, L) values at completion columns packed left into (B, T_max) response coords."""
        lengths = self.response_lengths
        width = int(lengths.max()) if len(self) else 0
        out = torch.zeros((len(self), width), dtype=values.dtype, device=values.device)
        rows, cols = self.response_mask.nonzero(as_tuple=True)
        index = (self.response_mask.cumsum(dim=-1) - 1).long()
        out[rows, index[rows, cols]] = values[rows, cols]
        return out

    def lists_to_full(self, values: list[list[float]]) -> Tensor:
        """Per-response-token python lists (e.g. sampling log-probs) as a (B, L) tensor."""
        lengths = self.response_lengths.tolist()
        if [len(v) for v in values] != lengths:
            raise ValueError(
                f"need one value per completion token: lengths {[len(v) for v in values]} "
                f"!= response lengths {lengths}"
            )
        width = max(lengths, default=0)
        packed = torch.zeros((len(values), width), dtype=torch.float32)
        for row, row_values in enumerate(values):
            packed[row, : len(row_values)] = torch.tensor(row_values, dtype=torch.float32)
        return self.response_to_full(packed.to(self.response_mask.device))


def update_tensors(
    batch: PolicyBatch, advantages: Tensor, old_logprobs: Tensor | None = None
) -> dict[str, Tensor]:
    """One policy update's inputs as named, contiguous CPU tensors, for another process (a
    safetensors file for the DeepSpeed launcher's ranks, Ray's object store for long-lived
    ranks); `update_inputs` reads them back."""
    tensors = {
        "input_ids": batch.input_ids,
        "attention_mask": batch.attention_mask,
        "position_ids": batch.position_ids,
        "response_mask": batch.response_mask,
        "advantages": advantages,
    }
    if old_logprobs is not None:
        tensors["old_logprobs"] = old_logprobs
    return {name: value.detach().cpu().contiguous() for name, value in tensors.items()}


def update_inputs(
    tensors: dict[str, Tensor], device: torch.device | str
) -> tuple[PolicyBatch, Tensor, Tensor | None]:
    """`update_tensors`' batch, advantages and old log-probs (None if absent) on `device`."""
    on = {name: value.to(device) for name, value in tensors.items()}
    batch = PolicyBatch(
        on["input_ids"], on["attention_mask"], on["position_ids"], on["response_mask"]
    )
    return batch, on["advantages"], on.get("old_logprobs")


def build_policy_batch(
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    pad_id: int,
    padding_side: PaddingSide = "right",
) -> PolicyBatch:
    """Pad prompt + completion rows into a PolicyBatch (left or right padding)."""
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(
            f"need one completion per prompt (got {len(prompt_ids)} prompts, "
            f"{len(completion_ids)} completions)"
        )
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt needs at least one token (e.g. BOS) to condition on")
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right' (got {padding_side!r})")
    rows = len(prompt_ids)
    width = max(
        (len(p) + len(c) for p, c in zip(prompt_ids, completion_ids, strict=True)), default=0
    )
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((rows, width), dtype=torch.long)
    response_mask = torch.zeros((rows, width), dtype=torch.float32)
    for row, (prompt, completion) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
        length = len(prompt) + len(completion)
        start = 0 if padding_side == "right" else width - length
        input_ids[row, start : start + length] = torch.tensor(prompt + completion, dtype=torch.long)
        attention_mask[row, start : start + length] = 1
        response_mask[row, start + len(prompt) : start + length] = 1.0
    position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
    return PolicyBatch(input_ids, attention_mask, position_ids, response_mask)
