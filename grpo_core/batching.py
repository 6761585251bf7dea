"""Padded policy batches (prompt + completion rows) and per-token log-probs of responses.

Masks come from the true lengths, never from comparing ids with the pad id, and position
ids count attended tokens only, so left and right padding give the log-probs of unpadded
forward passes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import Tensor, nn

from grpo_core.losses import entropy_from_logits, token_logprobs

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


def _forward_tokens(
    model: nn.Module,
    batch: PolicyBatch,
    temperature: float,
    micro_batch_size: int | None,
    with_entropy: bool,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropies) of each token given its prefix, in row chunks; (B, L)."""
    size = micro_batch_size or max(len(batch), 1)
    logps: list[Tensor] = []
    entropies: list[Tensor] = []
    for start in range(0, len(batch), size):
        part = batch.select(torch.arange(start, min(start + size, len(batch))))
        shared = _shared_prompt_forward(model, part, temperature, with_entropy)
        if shared is not None:
            logps.append(shared[0])
            if with_entropy:
                assert shared[1] is not None
                entropies.append(shared[1])
            continue
        logits = model(
            input_ids=part.input_ids,
            attention_mask=part.attention_mask,
            position_ids=part.position_ids,
            use_cache=False,
        ).logits[:, :-1]
        # position j holds log p(input_ids[j] | input_ids[<j]); column 0 has no prefix.
        logp = token_logprobs(logits, part.input_ids[:, 1:], temperature)
        logp = torch.nn.functional.pad(logp, (1, 0))
        logps.append(torch.where(part.response_mask > 0, logp, torch.zeros_like(logp)))
        if with_entropy:
            entropy = torch.nn.functional.pad(entropy_from_logits(logits, temperature), (1, 0))
            entropies.append(entropy * part.response_mask)
    if not logps:
        empty = torch.zeros_like(batch.response_mask)
        return empty, (empty if with_entropy else None)
    return torch.cat(logps), (torch.cat(entropies) if with_entropy else None)


def _shared_prompt_forward(
    model: nn.Module, part: PolicyBatch, temperature: float, with_entropy: bool
) -> tuple[Tensor, Tensor | None] | None:
    """_forward_tokens for rows that share prompts (G samples per prompt): each distinct prompt
    is run once, its KV cache is copied to its rows, and only completions run per row.

    Same log-probs (and gradients) as the full padded pass, with the prompt tokens computed
    once per group instead of once per row. None when no two rows share a prompt.
    """
    is_prompt = (part.attention_mask > 0) & (part.response_mask == 0)
    # each row's prompt ids moved to the right end (-1 before them), then deduplicated: the
    # distinct prompts come out left-padded, all ending in the last column
    order = torch.argsort(is_prompt.to(torch.int8), dim=1, stable=True)
    keyed = torch.where(is_prompt, part.input_ids, torch.full_like(part.input_ids, -1))
    unique, owner = torch.unique(keyed.gather(1, order), dim=0, return_inverse=True)
    lengths = part.response_lengths
    width = int(lengths.max()) if len(part) else 0
    if unique.shape[0] == len(part) or width == 0:
        return None
    prompt_attn = (unique >= 0).long()
    prompt_ids = unique.clamp(min=0)
    prompt_pos = (prompt_attn.cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=prompt_ids,
        attention_mask=prompt_attn,
        position_ids=prompt_pos,
        use_cache=True,
        logits_to_keep=1,
    )
    cache = out.past_key_values
    cache.reorder_cache(owner)  # (U, ...) -> one copy of its prompt's keys/values per row
    # completions, right-padded in response coordinates
    completion_ids = part.full_to_response(part.input_ids)
    completion_mask = torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]
    prompt_lengths = prompt_attn.sum(-1)[owner]
    rest = model(
        input_ids=completion_ids,
        attention_mask=torch.cat([prompt_attn[owner], completion_mask.long()], dim=1),
        position_ids=prompt_lengths[:, None] + torch.arange(width, device=lengths.device),
        past_key_values=cache,
        use_cache=True,
    ).logits[:, :-1]
    first = out.logits[owner]  # (B, 1, V): predicts completion token 0
    logp = torch.cat(
        [
            token_logprobs(first, completion_ids[:, :1], temperature),
            token_logprobs(rest, completion_ids[:, 1:], temperature),
        ],
        dim=1,
    )
    logp = part.response_to_full(torch.where(completion_mask, logp, torch.zeros_like(logp)))
    if not with_entropy:
        return logp, None
    entropy = torch.cat(
        [entropy_from_logits(first, temperature), entropy_from_logits(rest, temperature)], dim=1
    )
    return logp, part.response_to_full(entropy * completion_mask)


def sequence_logprobs(
    model: nn.Module,
    batch: PolicyBatch,
    temperature: float = 1.0,
    micro_batch_size: int | None = None,
) -> Tensor:
    """log pi(o_t | q, o_<t) at every completion column, 0 elsewhere; (B, L) float32."""
    logp, _ = _forward_tokens(model, batch, temperature, micro_batch_size, with_entropy=False)
    return logp


def sequence_logprobs_and_entropy(
    model: nn.Module,
    batch: PolicyBatch,
    temperature: float = 1.0,
    micro_batch_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """sequence_logprobs plus the (no-grad) entropy of each completion position; (B, L) x2."""
    logp, entropy = _forward_tokens(model, batch, temperature, micro_batch_size, with_entropy=True)
    assert entropy is not None
    return logp, entropy
