"""Micro-batches by token budget (verl's use_dynamic_bsz / ppo_max_token_len_per_gpu): rows
sorted by length and packed so each micro-batch, padded to its own longest row, stays within
grpo.algo.max_tokens_per_micro_batch; the padding share such a plan leaves; the row and
column cuts the policy update, its no-grad forwards and the critic run on.

With grpo.algo.padding_free each micro-batch runs as one packed row without padding
(grpo_core/model/packing.py) and the budget bounds its tokens; otherwise the budget
minimises padding.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from grpo_core.contracts.policy_batch import PolicyBatch
from grpo_core.model.forward import sequence_logprobs

log = logging.getLogger(__name__)

_BUDGETS_NOTED: set[int] = set()


def plan_micro_batches(
    lengths: Sequence[int], max_tokens: int, packed: bool = False
) -> list[list[int]]:
    """Row indices of each micro-batch: rows sorted longest first (ties in index order) and
    cut greedily, a micro-batch taking the next row while rows x its first (longest) row, or
    when `packed` the sum of its rows' lengths, stays within `max_tokens`. A row longer than
    the budget goes alone. Longest micro-batch first."""
    return plan_passes([(1, length) for length in lengths], max_tokens, packed)


def plan_passes(
    shapes: Sequence[tuple[int, int]], max_tokens: int, packed: bool = False
) -> list[list[int]]:
    """plan_micro_batches of items that each put (sequences, longest sequence's tokens) in a
    pass and are never split (a reward model's pair group): a pass takes the next item while
    its sequences x its first item's longest, or when `packed` its tokens, stay within
    `max_tokens`."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1 (got {max_tokens})")
    order = sorted(range(len(shapes)), key=lambda item: -shapes[item][1])
    plan: list[list[int]] = []
    width = sequences = tokens = 0
    for item in order:
        rows, size = shapes[item][0], max(shapes[item][1], 1)
        fits = tokens + rows * size if packed else (sequences + rows) * width
        if plan and fits <= max_tokens:
            plan[-1].append(item)
            sequences += rows
            tokens += rows * size
        else:
            plan.append([item])
            width, sequences, tokens = size, rows, rows * size
    return plan


def padding_share(
    lengths: Sequence[int], plan: Sequence[Sequence[int]], width: int | None = None
) -> float:
    """Share of padded positions in the micro-batches of `plan`: 1 - tokens / (rows x width),
    summed over micro-batches; width is each micro-batch's longest row, or `width` for all
    (fixed-row micro-batches keep the whole batch's columns). 0 for no token position."""
    tokens = sum(lengths[row] for rows in plan for row in rows)
    positions = sum(
        len(rows) * (max(lengths[row] for row in rows) if width is None else width)
        for rows in plan
        if rows
    )
    return 1.0 - tokens / positions if positions else 0.0


def row_lengths(batch: PolicyBatch) -> list[int]:
    """Tokens each row attends to (prompt and completion): its width in a padded forward."""
    lengths: list[int] = batch.attention_mask.sum(dim=-1).tolist()
    return lengths


def note_rows_over_budget(lengths: Sequence[int], max_tokens: int) -> None:
    """Log once per budget that a row longer than it runs alone, over the budget."""
    longest = max(lengths, default=0)
    if longest > max_tokens and max_tokens not in _BUDGETS_NOTED:
        _BUDGETS_NOTED.add(max_tokens)
        log.warning(
            "a row of %d tokens is longer than grpo.algo.max_tokens_per_micro_batch = %d: it "
            "runs alone in its micro-batch (raise the budget to bound memory by it)",
            longest,
            max_tokens,
        )


def rank_micro_batches(
    rows: Tensor, micro_batch_size: int, rank: int = 0, world_size: int = 1
) -> list[tuple[Tensor, bool]]:
    """This rank's share of a mini-batch's row indices as micro-batches, with a live flag.

    One process: consecutive chunks of micro_batch_size rows, all live. Several: rank r
    takes the r-th of world_size near-equal shares, cut into the same number of chunks on
    every rank (ZeRO passes are collective); a rank with fewer rows than chunks pads with
    a non-live pass over one row, which the caller masks out.
    """
    if world_size == 1:
        return [(micro, True) for micro in torch.split(rows, micro_batch_size)]
    share = torch.tensor_split(rows, world_size)[rank]
    passes = math.ceil(math.ceil(len(rows) / world_size) / micro_batch_size)
    chunks = [(micro, True) for micro in torch.tensor_split(share, passes) if len(micro)]
    return chunks + [(rows[:1], False)] * (passes - len(chunks))


def rank_token_micro_batches(
    rows: Tensor,
    lengths: Sequence[int],
    max_tokens: int,
    rank: int = 0,
    world_size: int = 1,
    packed: bool = False,
) -> list[tuple[Tensor, bool]]:
    """This rank's share of `rows` (indices; `lengths` gives each index's tokens) as token-
    budget micro-batches (plan_micro_batches; `packed`: the budget bounds the tokens), with a
    live flag. Each rank plans every rank's share (the same tensor_split as
    rank_micro_batches), so all run the same number of passes without a collective; a rank
    with fewer pads with non-live passes over one row."""
    note_rows_over_budget([lengths[r] for r in rows.tolist()], max_tokens)
    shares = torch.tensor_split(rows, world_size)
    plans = [
        plan_micro_batches([lengths[r] for r in share.tolist()], max_tokens, packed)
        for share in shares
    ]
    share, plan = shares[rank], plans[rank]
    passes = max(len(p) for p in plans)
    chunks = [(share[torch.tensor(at, dtype=torch.long, device=rows.device)], True) for at in plan]
    return chunks + [(rows[:1], False)] * (passes - len(chunks))


def attended_columns(batch: PolicyBatch) -> slice:
    """The columns holding a token of some row (padding columns on either side left out)."""
    attended = (batch.attention_mask > 0).any(dim=0).nonzero().flatten()
    if not len(attended):
        return slice(0, 0)
    return slice(int(attended[0]), int(attended[-1]) + 1)


def columns(batch: PolicyBatch, span: slice) -> PolicyBatch:
    """The batch cut to the columns of `span` (position ids kept: same log-probs)."""
    return PolicyBatch(
        batch.input_ids[:, span],
        batch.attention_mask[:, span],
        batch.position_ids[:, span],
        batch.response_mask[:, span],
    )


def widen(values: Tensor, span: slice, width: int) -> Tensor:
    """(b, span) values placed back at their columns of a (b, width) batch, 0 elsewhere."""
    return nn.functional.pad(values, (span.start, width - span.stop))


def trimmed_forward(forward: Callable[[PolicyBatch], Tensor], batch: PolicyBatch) -> Tensor:
    """`forward` of a (b, L) batch run on its attended columns only; (b, L) values."""
    span = attended_columns(batch)
    return widen(forward(columns(batch, span)), span, batch.input_ids.shape[1])


def planned_logprobs(
    model: nn.Module,
    batch: PolicyBatch,
    temperature: float,
    max_tokens: int,
    logits_chunk_tokens: int | None = None,
    packed: bool = False,
) -> Tensor:
    """sequence_logprobs of a batch, run in token-budget micro-batches, each on its own
    columns or (`packed`) as one packed row; (B, L)."""
    lengths = row_lengths(batch)
    note_rows_over_budget(lengths, max_tokens)
    out = torch.zeros_like(batch.response_mask)
    for rows in plan_micro_batches(lengths, max_tokens, packed):
        at = torch.tensor(rows, dtype=torch.long, device=batch.input_ids.device)

        def run(part: PolicyBatch) -> Tensor:
            return sequence_logprobs(model, part, temperature, None, logits_chunk_tokens, packed)

        out[at] = run(batch.select(at)) if packed else trimmed_forward(run, batch.select(at))
    return out
