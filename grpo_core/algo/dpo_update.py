"""One DPO policy update on a step's pairs (docs/algorithm.md section 12): the reference's
sequence log-probs once, then mu epochs of mini-batches of whole pairs, split over ranks."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.dpo import (
    PreferenceTerms,
    pair_rows,
    preference_loss,
    row_sides,
    sequence_logprob,
)
from grpo_core.algo.micro_batches import rank_micro_batches
from grpo_core.algo.row_dedup import RowCopies
from grpo_core.contracts.numerics import DIVERGED, require_finite
from grpo_core.contracts.policy_batch import PolicyBatch
from grpo_core.contracts.training import TrainEngine
from grpo_core.model.checkpointing import set_gradient_checkpointing
from grpo_core.model.packing import packs

# Sums over every pair a pass trained on (a pair counts once per epoch), divided by the count.
_PAIR_MEANS = {
    "dpo_loss": "losses",
    "dpo_reward_margin": "margins",
    "dpo_reward_accuracy": "accuracy",
    "dpo_chosen_reward": "chosen",
    "dpo_rejected_reward": "rejected",
}


def dpo_update(
    engine: TrainEngine,
    ref_model: nn.Module | None,
    batch: PolicyBatch,
    advantages: Tensor,
    cfg: GRPOConfig,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """The DPO loss of cfg.dpo on the pairs a pairing estimator marked in `advantages` (B, L)
    (+1 chosen, -1 rejected, 0 in no pair; dpo.py); averaged metrics.

    Each epoch shuffles the pairs (with `generator`) into cfg.mini_batches_per_epoch optimizer
    steps (at most one per pair); a micro-batch holds micro_batch_size // 2 pairs (at least
    one), both outputs of a pair in the same pass, and its loss is divided by the
    mini-batch's pairs, so the passes add up to the mean loss over the mini-batch. With
    engine.data_parallel_size > 1 every rank passes the same batch and generator and runs its
    share of each mini-batch's pairs.
    """
    if ref_model is None:
        raise ValueError("the DPO loss needs the reference model pi_ref (got None)")
    chosen, rejected = pair_rows(row_sides(advantages, batch.response_mask))
    pairs = len(chosen)
    if pairs == 0:
        raise ValueError("the DPO update needs at least one pair (the step skips a batch without)")
    device = batch.input_ids.device
    paired = batch.select(torch.cat([chosen, rejected]).to(device))  # rows i and pairs + i
    form = cfg.dpo.sequence_logprob
    engine.train()
    set_gradient_checkpointing(engine.model, cfg.gradient_checkpointing)
    packed = packs(engine.model, cfg.padding_free, "policy")
    with engine.forward_context():  # the reference runs at the policy's precision
        ref_logp = RowCopies(paired).logprobs(
            ref_model,
            cfg.temperature,
            cfg.micro_batch_size,
            None,
            cfg.logits_chunk_tokens,
            packs(ref_model, cfg.padding_free, "reference model"),
        )
    ref_seq = sequence_logprob(ref_logp, paired.response_mask, form)
    per_pass = max(1, cfg.micro_batch_size // 2)
    rank, world = engine.data_parallel_rank, engine.data_parallel_size
    sums = dict.fromkeys([*_PAIR_MEANS.values(), "pairs"], 0.0)
    grad_norm_total, steps = 0.0, 0
    for _ in range(cfg.mu):
        order = torch.randperm(pairs, generator=generator)
        for mini in torch.tensor_split(order, min(cfg.mini_batches_per_epoch, pairs)):
            for micro, live in rank_micro_batches(mini, per_pass, rank, world):
                at = micro.to(device)
                part = paired.select(torch.cat([at, at + pairs]))
                logp, _ = engine.forward_logprobs(
                    part,
                    cfg.temperature,
                    logits_chunk_tokens=cfg.logits_chunk_tokens,
                    packed=packed,
                )
                seq = sequence_logprob(logp, part.response_mask, form)
                n = len(micro)
                terms = preference_loss(seq[:n], seq[n:], ref_seq[at], ref_seq[at + pairs], cfg.dpo)
                # a padding pass (ranks with fewer pairs): the same collectives, no loss
                loss = terms.losses.sum() / len(mini) * float(live)
                require_finite("DPO loss", loss, where="the policy update", cause=DIVERGED)
                engine.backward(loss)
                if live:
                    _add(sums, terms)
            grad_norm_total += engine.step()
            steps += 1
    if world > 1:
        keys = sorted(sums)
        reduced = engine.all_reduce(
            torch.tensor([sums[k] for k in keys], dtype=torch.float64), "sum"
        )
        sums = dict(zip(keys, reduced.tolist(), strict=True))
    result = {name: sums[key] / sums["pairs"] for name, key in _PAIR_MEANS.items()}
    result.update(
        loss=result["dpo_loss"],
        dpo_pairs=float(pairs),
        grad_norm=grad_norm_total / steps,
        optimizer_steps=float(steps),
        lr=engine.current_lr(),
    )
    return result


def _add(sums: dict[str, float], terms: PreferenceTerms) -> None:
    """A live pass's pairs into the sums; accuracy counts a pair whose chosen output has the
    higher implicit reward (TRL's rewards/accuracies)."""
    margins = terms.margins
    sums["losses"] += float(terms.losses.detach().sum())
    sums["margins"] += float(margins.sum())
    sums["accuracy"] += float((margins > 0).float().sum())
    sums["chosen"] += float(terms.chosen_rewards.sum())
    sums["rejected"] += float(terms.rejected_rewards.sum())
    sums["pairs"] += len(margins)
