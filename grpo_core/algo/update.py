"""One GRPO policy update on a rollout batch: pi_old and reference log-probs, then mu epochs
of mini-batch optimizer steps, each distinct row run once (row_dedup.py), split over ranks."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor, nn

from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.dpo_update import dpo_update
from grpo_core.algo.losses import grpo_loss
from grpo_core.algo.micro_batches import (
    attended_columns,
    columns,
    rank_micro_batches,
    rank_token_micro_batches,
    row_lengths,
    widen,
)
from grpo_core.algo.row_dedup import RowCopies, merge_rows
from grpo_core.contracts.numerics import DIVERGED, require_finite
from grpo_core.contracts.policy_batch import PolicyBatch
from grpo_core.contracts.training import TrainEngine
from grpo_core.model.checkpointing import set_gradient_checkpointing
from grpo_core.model.packing import packs


def grpo_update(
    engine: TrainEngine,
    ref_model: nn.Module | None,
    batch: PolicyBatch,
    advantages: Tensor,
    cfg: GRPOConfig,
    old_logprobs: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """Paper Algorithm 1, inner loop: mu epochs of GRPO steps on one batch; averaged metrics.

    advantages and old_logprobs (the sampler's log-probs: pi_old when
    cfg.use_sampling_logprobs_as_old, the rollout correction's denominator) are (B, L),
    aligned with batch.response_mask. Each epoch shuffles rows (with `generator`) into
    cfg.mini_batches_per_epoch optimizer steps; each step accumulates micro-batch gradients
    normalised by the whole mini-batch, so the gradient equals that of one pass over the
    mini-batch. With engine.data_parallel_size > 1 every rank passes the same batch and an
    identically seeded `generator`, runs its share of each mini-batch's rows, and the
    metrics are reduced over the ranks.

    Identical rows of a mini-batch (same tokens, advantages, given pi_old and, under the
    correction, sampler log-probs) run once, weighted by their count; the reference and
    pi_old forwards run once per distinct tokens.

    A pairing estimator's batch (cfg.estimator.pairs: +1 / -1 marks in `advantages`) trains
    with the DPO loss instead (dpo_update.py, section 12).
    """
    if cfg.estimator.pairs:
        return dpo_update(engine, ref_model, batch, advantages, cfg, generator)
    _check_inputs(batch, advantages, cfg, ref_model, old_logprobs)
    engine.train()
    set_gradient_checkpointing(engine.model, cfg.gradient_checkpointing)
    packed = packs(engine.model, cfg.padding_free, "policy")
    token_copies = RowCopies(batch)
    with engine.forward_context():  # pi_old and pi_ref at the update's precision
        old = _old_logprobs(engine, batch, cfg, old_logprobs, token_copies, packed)
        ref = None
        if cfg.beta > 0 and ref_model is not None:  # _check_inputs: beta > 0 has a reference
            ref = token_copies.logprobs(
                ref_model,
                cfg.temperature,
                cfg.micro_batch_size,
                cfg.max_tokens_per_micro_batch,
                cfg.logits_chunk_tokens,
                packs(ref_model, cfg.padding_free, "reference model"),
            )
    # rows merge when their tokens, advantages and pi_old (when given) are all equal, and
    # their sampler log-probs when the correction weighs by them
    given_old = None if old is None or old_logprobs is None else old
    sampler = old_logprobs if cfg.rollout_correction.on else None
    merge_keys = token_copies.keys(advantages, given_old, sampler)
    folded = _UpdateMetrics()
    lengths = row_lengths(batch)
    grad_norm_total, steps = 0.0, 0
    for _ in range(cfg.mu):
        order = torch.randperm(len(batch), generator=generator).to(batch.input_ids.device)
        for mini in torch.tensor_split(order, cfg.mini_batches_per_epoch):
            mini_mask = batch.response_mask[mini]
            # the loss normalisers are the whole mini-batch's, whichever micro-batch runs
            totals = (mini_mask.sum(), (mini_mask.sum(dim=-1) > 0).sum())  # tokens, sequences
            rank, world = engine.data_parallel_rank, engine.data_parallel_size
            merged = merge_rows(merge_keys, mini)
            slots = torch.arange(len(merged.distinct), device=mini.device)
            for at, live in _micro_batches(
                slots, merged.distinct, lengths, cfg, (rank, world), packed
            ):
                micro = merged.distinct[at]
                part = batch.select(micro)
                # token budget: the forward runs on the micro-batch's own columns only
                trims = cfg.max_tokens_per_micro_batch is not None and not packed
                span = attended_columns(part) if trims else None
                if not live:  # a padding pass: same collectives as the other ranks, no loss
                    part = replace(part, response_mask=torch.zeros_like(part.response_mask))
                # a padding pass stands for no row
                weights = merged.counts[at].to(part.response_mask) * float(live)
                stood_for = (
                    merged.copies_of(at)
                    if live
                    else (micro, torch.arange(len(micro), device=micro.device))
                )
                terms = _MicroBatch(
                    part,
                    advantages[micro],
                    old,
                    ref,
                    old_logprobs,
                    micro,
                    weights,
                    stood_for,
                    span,
                    packed,
                )
                folded.add(_backward(engine, terms, cfg, totals), _output_sums(terms))
                # every rank counts every pass, so the ranks reduce the same metric keys
                width = part.input_ids.shape[1] if span is None else span.stop - span.start
                tokens = sum(lengths[r] for r in micro.tolist())
                positions = tokens if packed else len(micro) * width
                folded.count_padding(tokens * live, positions * live)
            grad_norm_total += engine.step()
            steps += 1
    result = folded.averages(engine, steps)
    result.update(grad_norm=grad_norm_total / steps, optimizer_steps=float(steps))
    result["lr"] = engine.current_lr()
    return result


def _micro_batches(
    slots: Tensor,
    distinct: Tensor,
    lengths: list[int],
    cfg: GRPOConfig,
    ranks: tuple[int, int],
    packed: bool,
) -> list[tuple[Tensor, bool]]:
    """This rank's micro-batches of a mini-batch's slots (the rows `distinct` holds) among
    `ranks` (rank, world size): fixed rows (micro_batch_size), or cut by token budget
    (max_tokens_per_micro_batch; rows x longest row, or the tokens when `packed`)."""
    rank, world = ranks
    if cfg.max_tokens_per_micro_batch is None:
        return rank_micro_batches(slots, cfg.micro_batch_size, rank, world)
    slot_lengths = [lengths[row] for row in distinct.tolist()]
    return rank_token_micro_batches(
        slots, slot_lengths, cfg.max_tokens_per_micro_batch, rank, world, packed
    )


def _check_inputs(
    batch: PolicyBatch,
    advantages: Tensor,
    cfg: GRPOConfig,
    ref_model: nn.Module | None,
    sampler_logprobs: Tensor | None,
) -> None:
    rows = len(batch)
    if advantages.shape != batch.response_mask.shape:
        raise ValueError(
            f"advantages must be (B, L) = {tuple(batch.response_mask.shape)} aligned with the "
            f"response mask (got {tuple(advantages.shape)}); use PolicyBatch.response_to_full"
        )
    if not 1 <= cfg.mini_batches_per_epoch <= max(rows, 1):
        raise ValueError(
            f"mini_batches_per_epoch must be in [1, {rows}] for a batch of {rows} rows "
            f"(got {cfg.mini_batches_per_epoch})"
        )
    if cfg.beta > 0 and ref_model is None:
        raise ValueError(f"beta = {cfg.beta} > 0 needs a reference model (got None)")
    if cfg.rollout_correction.on and (
        sampler_logprobs is None or sampler_logprobs.shape != batch.response_mask.shape
    ):
        got = None if sampler_logprobs is None else tuple(sampler_logprobs.shape)
        raise ValueError(
            f"rollout_correction.mode = {cfg.rollout_correction.mode} needs the sampler's "
            f"log-probs as old_logprobs, (B, L) = {tuple(batch.response_mask.shape)} (got {got})"
        )


@dataclass
class _MicroBatch:
    """One micro-batch's rows and the full-batch tensors it indexes into."""

    part: PolicyBatch
    advantages: Tensor
    old: Tensor | None  # pi_old of the whole batch (None: the detached current log-probs)
    ref: Tensor | None
    sampling: Tensor | None  # the sampler's log-probs: the mismatch metric, the correction
    rows: Tensor
    weights: Tensor  # how many rows of the mini-batch each row stands for
    # every row these rows stand for, and the position in `rows` of the one standing for it
    copies: tuple[Tensor, Tensor]
    columns: slice | None  # the columns the forward runs on (None: all)
    packed: bool  # the rows run as one packed row without padding


def _backward(
    engine: TrainEngine, mb: _MicroBatch, cfg: GRPOConfig, totals: tuple[Tensor, Tensor]
) -> dict[str, float]:
    """Forward, GRPO loss and backward of one micro-batch; its metrics."""
    chunk = cfg.logits_chunk_tokens
    if mb.columns is None:
        logp, entropy = engine.forward_logprobs(
            mb.part, cfg.temperature, with_entropy=True, logits_chunk_tokens=chunk, packed=mb.packed
        )
    else:
        width = mb.part.input_ids.shape[1]
        cut, cut_entropy = engine.forward_logprobs(
            columns(mb.part, mb.columns),
            cfg.temperature,
            with_entropy=True,
            logits_chunk_tokens=chunk,
        )
        logp = widen(cut, mb.columns, width)
        entropy = None if cut_entropy is None else widen(cut_entropy, mb.columns, width)
    loss, metrics = grpo_loss(
        logp,
        logp.detach() if mb.old is None else mb.old[mb.rows],
        None if mb.ref is None else mb.ref[mb.rows],
        mb.advantages,
        mb.part.response_mask,
        cfg,
        entropy=entropy,
        num_tokens=totals[0],
        num_seqs=totals[1],
        row_weights=mb.weights,
        sampler_logp=None if mb.sampling is None else mb.sampling[mb.rows],
    )
    require_finite("GRPO loss", loss, where="the policy update", cause=DIVERGED)
    engine.backward(loss)
    if mb.sampling is not None:
        # every copy's own sampling log-probs against the one forward they share
        rows, at = mb.copies
        gap = (logp.detach()[at] - mb.sampling[rows]).abs() * mb.part.response_mask[at]
        metrics["sampling_logprob_gap_max"] = float(gap.max())
    return metrics


# Loss terms: the micro-batch terms of one optimizer step add up to that step's loss.
_ADDITIVE = ("loss", "policy_loss")
# Means over outputs, not tokens: folded from the sums and counts _output_sums gives.
_PER_OUTPUT = ("response_length", "zero_adv_seq_frac")


def _output_sums(mb: _MicroBatch) -> dict[str, tuple[float, float]]:
    """(sum, count) of each _PER_OUTPUT metric over the outputs a micro-batch stands for.
    Integer-valued, so every split into micro-batches and ranks adds up to the same figures
    exactly; response_length's sum is the response tokens counted."""
    lengths = mb.part.response_mask.sum(dim=-1)
    nonempty = (lengths > 0).to(lengths.dtype)
    no_advantage = (mb.advantages.abs() * mb.part.response_mask).sum(dim=-1) == 0
    return {
        "response_length": (float((mb.weights * lengths).sum()), float(mb.weights.sum())),
        "zero_adv_seq_frac": (
            float((mb.weights * nonempty * no_advantage).sum()),
            float((mb.weights * nonempty).sum()),
        ),
    }


@dataclass
class _UpdateMetrics:
    """grpo_loss's per-micro-batch metrics folded into the update's figures: token-weighted
    means, means over outputs (_PER_OUTPUT, from sums and counts), per-step sums of the loss
    terms, and maxima / minima (min(x) = -max(-x))."""

    sums: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    extremes: dict[str, float] = field(default_factory=dict)
    empty_extremes: dict[str, float] = field(default_factory=dict)  # without response tokens
    weight: float = 0.0

    def add(self, metrics: dict[str, float], outputs: dict[str, tuple[float, float]]) -> None:
        weight = outputs["response_length"][0]  # the response tokens counted
        self.weight += weight
        for key in _PER_OUTPUT:
            self.sums[f"{key}:sum"] += outputs[key][0]
            self.sums[f"{key}:count"] += outputs[key][1]
        for key, value in metrics.items():
            if key in _PER_OUTPUT:
                continue
            if key.endswith(("_max", "_min")):
                sign = 1.0 if key.endswith("_max") else -1.0
                seen = self.extremes.get(key, -math.inf)
                self.extremes[key] = max(seen, sign * value if weight > 0 else -math.inf)
                if weight == 0:
                    self.empty_extremes.setdefault(key, value)
            elif key in _ADDITIVE:
                self.sums[key] += value
            else:
                self.sums[key] += value * weight

    def count_padding(self, tokens: int, positions: int) -> None:
        """A forward pass over `positions` token positions, `tokens` of them real."""
        self.sums["padding:tokens"] += tokens
        self.sums["padding:positions"] += positions

    def averages(self, engine: TrainEngine, steps: int) -> dict[str, float]:
        """Means over tokens (loss terms: over optimizer steps), reduced over the ranks;
        padding_share: the share of padded positions in the micro-batches' forwards."""
        sums, extremes, weight = _reduce_over_ranks(engine, self.sums, self.extremes, self.weight)
        result = {key: value / max(weight, 1.0) for key, value in sums.items() if ":" not in key}
        positions = sums["padding:positions"]
        result["padding_share"] = 1.0 - sums["padding:tokens"] / positions if positions else 0.0
        for key in _ADDITIVE:
            result[key] = sums[key] / steps
        for key in _PER_OUTPUT:
            count = sums[f"{key}:count"]
            result[key] = sums[f"{key}:sum"] / count if count else 0.0
        for key, value in extremes.items():
            sign = 1.0 if key.endswith("_max") else -1.0
            # -inf: no response token was seen; NaN/inf otherwise is left for the caller's check
            result[key] = (
                sign * value if math.isfinite(value) else self.empty_extremes.get(key, value)
            )
        return result


def _reduce_over_ranks(
    engine: TrainEngine, sums: dict[str, float], extremes: dict[str, float], weight: float
) -> tuple[dict[str, float], dict[str, float], float]:
    """Metric sums, token weight and sign-folded maxima, summed / maxed over the ranks."""
    if engine.data_parallel_size == 1:
        return sums, extremes, weight
    sum_keys, max_keys = sorted(sums), sorted(extremes)
    totals = engine.all_reduce(
        torch.tensor([*(sums[k] for k in sum_keys), weight], dtype=torch.float64), "sum"
    ).tolist()
    maxima = engine.all_reduce(
        torch.tensor([extremes[k] for k in max_keys], dtype=torch.float64), "max"
    ).tolist()
    return (
        dict(zip(sum_keys, totals[:-1], strict=True)),
        dict(zip(max_keys, maxima, strict=True)),
        totals[-1],
    )


def _old_logprobs(
    engine: TrainEngine,
    batch: PolicyBatch,
    cfg: GRPOConfig,
    given: Tensor | None,
    copies: RowCopies,
    packed: bool,
) -> Tensor | None:
    """pi_old log-probs (B, L); None means 'the detached current log-probs' (mu = 1)."""
    if given is not None and cfg.use_sampling_logprobs_as_old:
        if given.shape != batch.response_mask.shape:
            raise ValueError(
                f"old_logprobs must be (B, L) = {tuple(batch.response_mask.shape)} "
                f"(got {tuple(given.shape)}); use PolicyBatch.lists_to_full"
            )
        return given
    if cfg.mu == 1 and cfg.mini_batches_per_epoch == 1:
        return None
    return copies.logprobs(
        engine.model,
        cfg.temperature,
        cfg.micro_batch_size,
        cfg.max_tokens_per_micro_batch,
        cfg.logits_chunk_tokens,
        packed,
    )
