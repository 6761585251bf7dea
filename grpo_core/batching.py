"""Padded policy batches (prompt + completion rows) and per-token log-probs of responses.

Masks come from the true lengths, never from comparing ids with the pad id, and position
ids count attended tokens only, so left and right padding give the log-probs of unpadded
forward passes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any, Literal

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

    The completions run in length buckets (`length_buckets`), each padded only to its own
    longest completion. Same log-probs (and gradients) as the full padded pass, with the
    prompt tokens computed once per group instead of once per row and almost no padding.
    None when no two rows share a prompt.
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
    # only the columns the longest prompt reaches (the rest held completion or padding)
    unique = unique[:, unique.shape[1] - int((unique >= 0).sum(-1).max()) :]
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
    # completions, right-padded in response coordinates
    completion_ids = part.full_to_response(part.input_ids)
    prompt_lengths = prompt_attn.sum(-1)[owner]
    buckets = length_buckets(lengths) if hasattr(out.past_key_values, "layers") else None
    if buckets is None:
        buckets = [torch.arange(len(part), device=lengths.device)]
    logps: list[Tensor] = []
    entropies: list[Tensor] = []
    for rows in buckets:
        w = int(lengths[rows].max())
        if w == 0:  # empty completions: nothing to score
            logps.append(torch.zeros((len(rows), width), device=lengths.device))
            entropies.append(logps[-1])
            continue
        ids = completion_ids[rows, :w]
        mask = torch.arange(w, device=lengths.device)[None, :] < lengths[rows, None]
        logits = [out.logits[owner[rows]]]  # (n, 1, V): predicts completion token 0
        if w > 1:
            cache = out.past_key_values if len(buckets) == 1 else _cache_copy(out.past_key_values)
            cache.reorder_cache(owner[rows])  # one copy of its prompt's keys/values per row
            rest = model(
                input_ids=ids,
                attention_mask=torch.cat([prompt_attn[owner[rows]], mask.long()], dim=1),
                position_ids=prompt_lengths[rows, None] + torch.arange(w, device=lengths.device),
                past_key_values=cache,
                use_cache=True,
            ).logits[:, :-1]
            logits.append(rest)  # (n, w - 1, V): predicts completion tokens 1 .. w - 1
        logp = torch.cat(
            [token_logprobs(logits[0], ids[:, :1], temperature)]
            + [token_logprobs(rest, ids[:, 1:], temperature) for rest in logits[1:]],
            dim=1,
        )
        logps.append(torch.nn.functional.pad(torch.where(mask, logp, 0.0), (0, width - w)))
        if with_entropy:
            entropy = torch.cat([entropy_from_logits(lg, temperature) for lg in logits], dim=1)
            entropies.append(torch.nn.functional.pad(entropy * mask, (0, width - w)))
    back = torch.argsort(torch.cat(buckets))  # bucket-major rows -> original row order
    logp_full = part.response_to_full(torch.cat(logps)[back])
    if not with_entropy:
        return logp_full, None
    return logp_full, part.response_to_full(torch.cat(entropies)[back])


# A bucket must save at least this many padded token positions to be worth its own forward
# pass (per-call overhead and smaller matmuls).
BUCKET_MIN_SAVING = 256


def length_buckets(lengths: Tensor, min_saving: int | None = None) -> list[Tensor]:
    """Rows grouped by completion length so each group pads only to its own longest row.

    Rows sorted by length are cut into consecutive groups minimising padded positions
    (rows x group maximum, summed) + min_saving per group: an exact dynamic programme over
    the distinct lengths (min_saving defaults to BUCKET_MIN_SAVING). Returns the row indices
    of each group, longest group first.
    """
    per_group = BUCKET_MIN_SAVING if min_saving is None else min_saving
    order = torch.argsort(lengths, descending=True, stable=True)
    values, counts = torch.unique_consecutive(lengths[order], return_counts=True)
    vals, cnts = values.tolist(), counts.tolist()
    n = len(vals)
    best = [0.0] + [float("inf")] * n  # best[i]: cost of the first i distinct lengths
    cut = [0] * (n + 1)
    for i in range(1, n + 1):
        rows = 0
        for j in range(i, 0, -1):  # last group = distinct lengths j-1 .. i-1 (max vals[j-1])
            rows += cnts[j - 1]
            cost = best[j - 1] + rows * vals[j - 1] + per_group
            if cost < best[i]:
                best[i], cut[i] = cost, j - 1
    bounds = []
    i = n
    while i > 0:
        bounds.append((cut[i], i))
        i = cut[i]
    starts = [0, *torch.tensor(cnts).cumsum(0).tolist()]
    return [order[starts[a] : starts[b]] for a, b in reversed(bounds)]


def _cache_copy(cache: Any) -> Any:
    """A cache whose layers can be re-indexed without touching `cache` (tensors shared)."""
    view = copy.copy(cache)
    view.layers = [copy.copy(layer) for layer in cache.layers]
    return view


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
