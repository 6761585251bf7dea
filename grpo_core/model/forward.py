"""Per-token log-probs and entropies of the responses in a PolicyBatch (forward passes).

Rows that share a prompt (the G samples of a group) run the prompt once and reuse its KV
cache; completions run in length buckets. Same log-probs as one padded pass. With
logits_chunk_tokens set, the logits go through the output layer in token chunks
(grpo_core/model/chunked_head.py). With `packed`, each pass's rows run as one row without
padding (grpo_core/model/packing.py) instead.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

from grpo_core.contracts.policy_batch import PolicyBatch
from grpo_core.model.checkpointing import recomputes_layers
from grpo_core.model.chunked_head import next_token_outputs
from grpo_core.model.kv_cache import cache_keyword, returned_cache
from grpo_core.model.logits import entropy_from_logits, token_logprobs
from grpo_core.model.packing import pack_rows


def _forward_tokens(
    model: nn.Module,
    batch: PolicyBatch,
    temperature: float,
    micro_batch_size: int | None,
    with_entropy: bool,
    logits_chunk_tokens: int | None = None,
    packed: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropies) of each token given its prefix, in row chunks; (B, L)."""
    size = micro_batch_size or max(len(batch), 1)
    logps: list[Tensor] = []
    entropies: list[Tensor] = []
    for start in range(0, len(batch), size):
        part = batch.select(torch.arange(start, min(start + size, len(batch))))
        if packed:
            logp, entropy = _packed_forward(
                model, part, temperature, with_entropy, logits_chunk_tokens
            )
            logps.append(logp)
            if entropy is not None:
                entropies.append(entropy)
            continue
        shared = _shared_prompt_forward(model, part, temperature, with_entropy, logits_chunk_tokens)
        if shared is not None:
            logps.append(shared[0])
            if with_entropy:
                assert shared[1] is not None
                entropies.append(shared[1])
            continue
        inputs = {
            "input_ids": part.input_ids,
            "attention_mask": part.attention_mask,
            "position_ids": part.position_ids,
            "use_cache": False,
        }
        logp, entropy = next_token_outputs(
            model, inputs, part.input_ids[:, 1:], temperature, with_entropy, logits_chunk_tokens
        )
        # position j holds log p(input_ids[j] | input_ids[<j]); column 0 has no prefix.
        logp = torch.nn.functional.pad(logp, (1, 0))
        logps.append(torch.where(part.response_mask > 0, logp, torch.zeros_like(logp)))
        if entropy is not None:
            entropies.append(torch.nn.functional.pad(entropy, (1, 0)) * part.response_mask)
    if not logps:
        empty = torch.zeros_like(batch.response_mask)
        return empty, (empty if with_entropy else None)
    return torch.cat(logps), (torch.cat(entropies) if with_entropy else None)


def _packed_forward(
    model: nn.Module,
    part: PolicyBatch,
    temperature: float,
    with_entropy: bool,
    logits_chunk_tokens: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """_forward_tokens of rows packed into one row without padding: each row's tokens see
    only that row's prefix (position ids restart per row); (B, L) values placed back. The
    shared-prompt cache cannot pack (transformers separates packed sequences only without a
    cache), so rows sharing a prompt each run it."""
    rows = pack_rows(part)
    if not len(rows):
        empty = torch.zeros_like(part.response_mask)
        return empty, (empty if with_entropy else None)
    logp, entropy = next_token_outputs(
        model,
        rows.model_inputs(),
        rows.input_ids[:, 1:],
        temperature,
        with_entropy,
        logits_chunk_tokens,
    )
    mask = part.response_mask
    logp_full = torch.where(mask > 0, rows.shift_unpack(logp[0]), 0.0)
    return logp_full, (None if entropy is None else rows.shift_unpack(entropy[0]) * mask)


def _shared_prompt_forward(
    model: nn.Module,
    part: PolicyBatch,
    temperature: float,
    with_entropy: bool,
    logits_chunk_tokens: int | None = None,
) -> tuple[Tensor, Tensor | None] | None:
    """_forward_tokens for rows that share prompts (G samples per prompt): each distinct prompt
    is run once, its KV cache is copied to its rows, and only completions run per row.

    The completions run in length buckets (`length_buckets`), each padded only to its own
    longest completion. Same log-probs (and gradients) as the full padded pass, with the
    prompt tokens computed once per group instead of once per row and almost no padding.
    None when no two rows share a prompt, or when the model recomputes its layers in
    backward (gradient checkpointing): the recompute would write the shared cache twice.
    """
    if torch.is_grad_enabled() and recomputes_layers(model):
        return None
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
    prompt_cache = returned_cache(out)
    buckets = length_buckets(lengths) if hasattr(prompt_cache, "layers") else None
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
        first = out.logits[owner[rows]]  # (n, 1, V): predicts completion token 0
        logp_parts = [token_logprobs(first, ids[:, :1], temperature)]
        entropy_parts = [entropy_from_logits(first, temperature)] if with_entropy else []
        if w > 1:
            cache = prompt_cache if len(buckets) == 1 else _cache_copy(prompt_cache)
            cache.reorder_cache(owner[rows])  # one copy of its prompt's keys/values per row
            inputs = {
                "input_ids": ids,
                "attention_mask": torch.cat([prompt_attn[owner[rows]], mask.long()], dim=1),
                "position_ids": prompt_lengths[rows, None] + torch.arange(w, device=lengths.device),
                "use_cache": True,
                cache_keyword(model): cache,
            }
            # (n, w - 1): predicts completion tokens 1 .. w - 1
            rest, rest_entropy = next_token_outputs(
                model, inputs, ids[:, 1:], temperature, with_entropy, logits_chunk_tokens
            )
            logp_parts.append(rest)
            if rest_entropy is not None:
                entropy_parts.append(rest_entropy)
        logp = torch.cat(logp_parts, dim=1)
        logps.append(torch.nn.functional.pad(torch.where(mask, logp, 0.0), (0, width - w)))
        if with_entropy:
            entropy = torch.cat(entropy_parts, dim=1)
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
    logits_chunk_tokens: int | None = None,
    packed: bool = False,
) -> Tensor:
    """log pi(o_t | q, o_<t) at every completion column, 0 elsewhere; (B, L) float32.
    logits_chunk_tokens: positions per pass through the output layer (None: all at once);
    packed: each pass's rows as one row without padding (the model must support it:
    packing.packs)."""
    logp, _ = _forward_tokens(
        model, batch, temperature, micro_batch_size, False, logits_chunk_tokens, packed
    )
    return logp


def sequence_outputs(
    model: nn.Module,
    batch: PolicyBatch,
    temperature: float,
    with_entropy: bool = False,
    logits_chunk_tokens: int | None = None,
    packed: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """sequence_logprobs of the whole batch in one pass, and the entropies when asked (None
    otherwise): what a training engine's forward_logprobs returns; (B, L), (B, L) | None."""
    return _forward_tokens(
        model, batch, temperature, None, with_entropy, logits_chunk_tokens, packed
    )


def sequence_logprobs_and_entropy(
    model: nn.Module,
    batch: PolicyBatch,
    temperature: float = 1.0,
    micro_batch_size: int | None = None,
    logits_chunk_tokens: int | None = None,
    packed: bool = False,
) -> tuple[Tensor, Tensor]:
    """sequence_logprobs plus the (no-grad) entropy of each completion position; (B, L) x2."""
    logp, entropy = _forward_tokens(
        model, batch, temperature, micro_batch_size, True, logits_chunk_tokens, packed
    )
    assert entropy is not None
    return logp, entropy
