"""One GRPO policy update on a rollout batch: pi_old and reference log-probs, then mu epochs."""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import Tensor, nn

from grpo_core.batching import PolicyBatch, sequence_logprobs
from grpo_core.config import GRPOConfig
from grpo_core.engine import TrainEngine
from grpo_core.losses import grpo_loss


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

    advantages and old_logprobs are (B, L), aligned with batch.response_mask. Each epoch
    shuffles rows (with `generator`) into cfg.mini_batches_per_epoch optimizer steps; each
    step accumulates micro-batch gradients normalised by the whole mini-batch, so the
    gradient equals that of one pass over the mini-batch.
    """
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
    engine.train()
    old = _old_logprobs(engine, batch, cfg, old_logprobs)
    ref = None
    if cfg.beta > 0:
        if ref_model is None:
            raise ValueError(f"beta = {cfg.beta} > 0 needs a reference model (got None)")
        with torch.no_grad():
            ref = sequence_logprobs(ref_model, batch, cfg.temperature, cfg.micro_batch_size)

    sums: dict[str, float] = defaultdict(float)
    extremes: dict[str, float] = {}
    weight_total = 0.0
    steps = 0
    for _ in range(cfg.mu):
        order = torch.randperm(rows, generator=generator).to(batch.input_ids.device)
        for mini in torch.tensor_split(order, cfg.mini_batches_per_epoch):
            mini_mask = batch.response_mask[mini]
            num_tokens = mini_mask.sum()
            num_seqs = (mini_mask.sum(dim=-1) > 0).sum()
            additive: dict[str, float] = defaultdict(float)  # micro terms sum to the loss
            for micro in torch.split(mini, cfg.micro_batch_size):
                part = batch.select(micro)
                logp, entropy = engine.forward_logprobs(part, cfg.temperature, with_entropy=True)
                part_old = logp.detach() if old is None else old[micro]
                loss, metrics = grpo_loss(
                    logp,
                    part_old,
                    None if ref is None else ref[micro],
                    advantages[micro],
                    part.response_mask,
                    cfg,
                    entropy=entropy,
                    num_tokens=num_tokens,
                    num_seqs=num_seqs,
                )
                engine.backward(loss)
                if old_logprobs is not None:
                    gap = (logp.detach() - old_logprobs[micro]).abs() * part.response_mask
                    metrics["sampling_logprob_gap_max"] = float(gap.max())
                weight = float(part.response_mask.sum())
                weight_total += weight
                for key, value in metrics.items():
                    if key.endswith("_max"):
                        extremes[key] = max(extremes.get(key, value), value)
                    elif key.endswith("_min"):
                        extremes[key] = min(extremes.get(key, value), value)
                    elif key in ("loss", "policy_loss"):
                        additive[key] += value
                    else:
                        sums[key] += value * weight
            sums["grad_norm"] += engine.step()
            for key, value in additive.items():
                sums[key] += value
            steps += 1
    result = {key: value / max(weight_total, 1.0) for key, value in sums.items()}
    result["grad_norm"] = sums["grad_norm"] / steps
    for key in ("loss", "policy_loss"):
        result[key] = sums[key] / steps
    result.update(extremes)
    result["optimizer_steps"] = float(steps)
    result["lr"] = engine.current_lr()
    return result


def _old_logprobs(
    engine: TrainEngine, batch: PolicyBatch, cfg: GRPOConfig, given: Tensor | None
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
    with torch.no_grad():
        return sequence_logprobs(engine.model, batch, cfg.temperature, cfg.micro_batch_size)
