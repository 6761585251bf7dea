"""Identical rows of a batch run once: a batch of G samples per prompt from a policy that has
learned its task holds many copies (40-50% in the demo). Rows are keyed by a digest of their
tokens (and of any per-row tensors that must also agree), merged, and counted.

The GRPO update (update.py) runs each distinct row once, weighted by its count (row_weights
in grpo_loss): the same loss and gradient, for the forward and backward passes of the
distinct rows only; the reference and pi_old forwards run once per distinct tokens.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from grpo_core.algo.micro_batches import planned_logprobs
from grpo_core.contracts.copies import first_copies
from grpo_core.contracts.policy_batch import PolicyBatch
from grpo_core.model.forward import sequence_logprobs


def row_keys(*tables: Tensor) -> list[bytes]:
    """One key per row of (B, ...) tensors: equal rows in every table, equal keys. A 128-bit
    digest of the row's bytes, so a batch of long rows (the paper's 32k x 1.5k tokens) keeps
    16 bytes per row, not its ~30 KB; two different rows share one with odds ~2^-128."""
    if not tables:
        raise ValueError("row_keys needs at least one table")
    flat = [t.detach().reshape(len(t), -1).cpu().contiguous().numpy() for t in tables]
    keys = []
    for i in range(len(tables[0])):
        digest = hashlib.blake2b(digest_size=16)
        for table in flat:
            digest.update(table[i].tobytes())
        keys.append(digest.digest())
    return keys


class RowCopies:
    """The rows of a batch grouped by their tokens (prompt, completion and layout)."""

    def __init__(self, batch: PolicyBatch) -> None:
        self.batch = batch
        self.token_keys = row_keys(batch.input_ids, batch.attention_mask, batch.response_mask)
        firsts, groups = first_copies(self.token_keys)
        self.firsts = torch.tensor(firsts, dtype=torch.long)
        self.group = torch.tensor(groups, dtype=torch.long)

    def logprobs(
        self,
        model: nn.Module,
        temperature: float,
        micro_batch_size: int,
        max_tokens: int | None = None,
        logits_chunk_tokens: int | None = None,
        packed: bool = False,
    ) -> Tensor:
        """sequence_logprobs of every row (no grad), one forward per distinct row, in
        micro-batches of micro_batch_size rows or (when given) of max_tokens tokens;
        logits_chunk_tokens positions at a time through the output layer; `packed`: each
        micro-batch as one row without padding."""
        device = self.batch.input_ids.device
        distinct_rows = self.batch.select(self.firsts.to(device))
        with torch.no_grad():
            if max_tokens is None:
                distinct = sequence_logprobs(
                    model,
                    distinct_rows,
                    temperature,
                    micro_batch_size,
                    logits_chunk_tokens,
                    packed,
                )
            else:
                distinct = planned_logprobs(
                    model, distinct_rows, temperature, max_tokens, logits_chunk_tokens, packed
                )
        return distinct[self.group.to(device)]

    def keys(self, *per_row: Tensor | None) -> list[bytes]:
        """Each row's token key joined with its key in the given (B, ...) tensors."""
        extra = row_keys(*(t for t in per_row if t is not None))
        return [a + b for a, b in zip(self.token_keys, extra, strict=True)]


@dataclass(frozen=True)
class MergedRows:
    """A mini-batch's rows merged by key: the first row of each key (in mini-batch order),
    how many rows it stands for, and for every row the slot of the one standing for it."""

    rows: Tensor
    distinct: Tensor
    counts: Tensor
    slot: Tensor

    def copies_of(self, slots: Tensor) -> tuple[Tensor, Tensor]:
        """The rows that `slots` stand for, and each one's position in `slots`."""
        position = torch.full_like(self.counts, -1)
        position[slots] = torch.arange(len(slots), device=slots.device)
        at = position[self.slot]
        inside = at >= 0
        return self.rows[inside], at[inside]


def merge_rows(keys: list[bytes], rows: Tensor) -> MergedRows:
    """`rows` (indices into `keys`) merged where their keys are equal."""
    firsts, groups = first_copies(keys[r] for r in rows.tolist())
    slot = torch.tensor(groups, dtype=torch.long, device=rows.device)
    counts = torch.bincount(slot, minlength=len(firsts))
    return MergedRows(rows, rows[torch.tensor(firsts, device=rows.device)], counts, slot)
