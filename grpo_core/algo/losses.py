"""KL estimators, the clipped surrogate, loss aggregation and the GRPO loss.

Shapes: B sequences, T token positions, V vocabulary. Masks mark response tokens; prompt
and padding positions never count (docs/algorithm.md notation).
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo_core.algo.config import GRPOConfig, KLEstimator, LossAgg
from grpo_core.algo.importance import (
    MAX_LOG_RATIO,
    RolloutWeights,
    policy_ratio,
    rollout_weights,
    token_ratio,
)
from grpo_core.algo.importance_config import RolloutCorrection


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: KLEstimator = "k3") -> Tensor:
    """Per-token KL(pi_theta || pi_ref) estimate, spec section 2 (k3: x - log x - 1)."""
    log_ratio = (ref_logp - logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # log x
    if kind == "k3":
        return torch.exp(log_ratio) - log_ratio - 1.0
    if kind == "k1":
        return -log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2
    raise ValueError(f"KL estimator must be 'k1', 'k2' or 'k3' (got {kind!r})")


def clip_ratio(ratio: Tensor, eps_low: float = 0.2, eps_high: float = 0.2) -> Tensor:
    """clip(ratio, 1 - eps_low, 1 + eps_high), spec section 1."""
    return ratio.clamp(1.0 - eps_low, 1.0 + eps_high)


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
) -> tuple[Tensor, Tensor, Tensor]:
    """PPO/GRPO surrogate, spec section 1: min(ratio * A, clip(ratio) * A) per token, with
    the token ratio; ratio_surrogate's results."""
    return ratio_surrogate(token_ratio(logp, old_logp), advantages, eps_low, eps_high)


def ratio_surrogate(
    ratio: Tensor, advantages: Tensor, eps_low: float = 0.2, eps_high: float = 0.2
) -> tuple[Tensor, Tensor, Tensor]:
    """min(ratio * A, clip(ratio) * A) per token for any ratio (token, sequence: section 10).

    Returns (surrogate, clipped_low, clipped_high): the masks mark tokens where the clipped
    branch is the minimum and the gradient is zero (A < 0 below 1 - eps_low, A > 0 above
    1 + eps_high).
    """
    surrogate = torch.minimum(ratio * advantages, clip_ratio(ratio, eps_low, eps_high) * advantages)
    clipped_low = (ratio < 1.0 - eps_low) & (advantages < 0)
    clipped_high = (ratio > 1.0 + eps_high) & (advantages > 0)
    return surrogate, clipped_low, clipped_high


def agg_loss(
    loss_mat: Tensor,
    mask: Tensor,
    mode: LossAgg,
    max_len: int | None = None,
    *,
    num_tokens: Tensor | float | None = None,
    num_seqs: Tensor | float | None = None,
    row_weights: Tensor | None = None,
) -> Tensor:
    """Aggregate a (B, T) per-token loss over response tokens, spec section 3.

    seq-mean-token-mean: mean over sequences of each sequence's token mean (paper).
    token-mean: sum over tokens / number of tokens (DAPO).
    seq-mean-token-sum-norm: mean over sequences of token sum / max_len (Dr. GRPO).
    Empty responses add nothing and are not counted as sequences. For a micro-batch of a
    larger batch pass the full batch's `num_tokens` / `num_seqs`: the micro-batch losses
    then sum to the full-batch loss. `row_weights` (B,) says how many identical rows each
    row stands for: the loss equals that of the batch with each row repeated that often.
    """
    mask = mask.to(loss_mat.dtype)
    masked = torch.where(mask > 0, loss_mat, torch.zeros_like(loss_mat))
    lengths = mask.sum(dim=-1)
    if row_weights is None:  # the plain sums (their float order is the one runs reproduce)
        seq_counts, token_counts = (lengths > 0).sum(), lengths.sum()
    else:
        weights = row_weights.to(loss_mat.dtype)
        masked = masked * weights[:, None]
        seq_counts, token_counts = (weights * (lengths > 0)).sum(), (weights * lengths).sum()
    num_seqs = seq_counts if num_seqs is None else num_seqs
    num_tokens = token_counts if num_tokens is None else num_tokens
    if mode == "token-mean":
        return masked.sum() / _at_least_one(num_tokens)
    if mode == "seq-mean-token-mean":
        seq_loss = masked.sum(dim=-1) / lengths.clamp(min=1.0)
        return seq_loss.sum() / _at_least_one(num_seqs)
    if mode == "seq-mean-token-sum-norm":
        if max_len is None or max_len <= 0:
            raise ValueError(f"loss mode {mode!r} needs a positive max_len (got {max_len})")
        return masked.sum() / max_len / _at_least_one(num_seqs)
    raise ValueError(
        f"loss aggregation must be 'seq-mean-token-mean', 'token-mean' or "
        f"'seq-mean-token-sum-norm' (got {mode!r})"
    )


def _at_least_one(count: Tensor | float) -> Tensor | float:
    if isinstance(count, Tensor):
        return count.clamp(min=1.0)
    return max(count, 1.0)


def _masked_mean(values: Tensor, mask: Tensor) -> float:
    """Mean of `values` over the positions of `mask`, each counted `mask` times."""
    picked = torch.where(mask > 0, values * mask, torch.zeros_like(values))
    return float(picked.sum() / mask.sum().clamp(min=1.0))


def _row_mean(values: Tensor, among: Tensor | None, row_weights: Tensor | None) -> float:
    """Mean of per-row `values` over the rows of `among` (all rows when None; values are 0
    outside it), each row counted row_weights times; 0 without rows."""
    if row_weights is None:
        if among is None:
            return float(values.float().mean()) if values.numel() else 0.0
        return float(values.sum() / among.sum().clamp(min=1))
    weights = row_weights.to(torch.float32)
    counted = weights if among is None else weights * among
    return float((weights * values).sum() / counted.sum().clamp(min=1))


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    cfg: GRPOConfig,
    *,
    entropy: Tensor | None = None,
    num_tokens: Tensor | float | None = None,
    num_seqs: Tensor | float | None = None,
    row_weights: Tensor | None = None,
    sampler_logp: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Negative GRPO objective, spec section 3: -(w * surrogate - beta * KL), aggregated.

    All tensors are (B, T) and aligned; `ref_logp` may be None only when cfg.beta == 0.
    The surrogate's ratio is cfg.importance_sampling's (section 10); w is the rollout
    correction's weight from `sampler_logp` (section 11; 1 when cfg.rollout_correction is
    off, and then `sampler_logp` is not read). `entropy` (no grad) is only reported; `kl`
    only where the loss has a KL term (beta > 0).
    `num_tokens` / `num_seqs` / `row_weights` as in agg_loss: the loss and the metrics count
    each row row_weights times.
    """
    maskf = mask.to(torch.float32)
    ratio = policy_ratio(logp, old_logp, maskf, cfg.importance_sampling)
    surrogate, clipped_low, clipped_high = ratio_surrogate(ratio, advantages, *cfg.clip_range)
    policy_term = -surrogate
    correction = None
    if cfg.rollout_correction.on:
        if sampler_logp is None:
            raise ValueError(
                f"rollout_correction.mode = {cfg.rollout_correction.mode} needs the sampler's "
                "log-probs (got None)"
            )
        correction = rollout_weights(old_logp, sampler_logp, maskf, cfg.rollout_correction)
        policy_term = policy_term * correction.weights
    loss_mat = policy_term
    kl: Tensor | None = None
    if cfg.beta > 0:
        if ref_logp is None:
            raise ValueError(f"beta = {cfg.beta} > 0 needs reference log-probs (got None)")
        kl = kl_penalty(logp, ref_logp, cfg.kl_estimator)
        loss_mat = loss_mat + cfg.beta * kl

    def aggregate(mat: Tensor) -> Tensor:
        return agg_loss(
            mat,
            maskf,
            cfg.loss_agg,
            cfg.max_len_norm,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            row_weights=row_weights,
        )

    loss = aggregate(loss_mat)
    with torch.no_grad():
        lengths = maskf.sum(dim=-1)
        nonempty = lengths > 0
        zero_adv = ((advantages.abs() * maskf).sum(dim=-1) == 0) & nonempty
        ratio = ratio.detach()
        in_mask = mask.bool()
        # counted masks: each row's tokens (and the row itself) row_weights times
        counted = maskf if row_weights is None else maskf * row_weights.to(maskf.dtype)[:, None]
        metrics = {
            "loss": float(loss.detach()),
            "policy_loss": float(aggregate(policy_term)),  # weighted when corrected
            **({} if kl is None else {"kl": _masked_mean(kl, counted)}),
            "clip_frac_low": _masked_mean(clipped_low.float(), counted),
            "clip_frac_high": _masked_mean(clipped_high.float(), counted),
            "approx_kl_old": _masked_mean(kl_penalty(old_logp, logp, "k3"), counted),
            "zero_adv_seq_frac": _row_mean(zero_adv, nonempty, row_weights),
            "response_length": _row_mean(lengths, None, row_weights),
            "ratio_mean": _masked_mean(ratio, counted),
            "ratio_max": float(ratio[in_mask].max()) if in_mask.any() else 1.0,
            "ratio_min": float(ratio[in_mask].min()) if in_mask.any() else 1.0,
        }
        if entropy is not None:
            metrics["entropy"] = _masked_mean(entropy, counted)
        if correction is not None:
            metrics.update(_correction_metrics(correction, cfg.rollout_correction, counted))
    return loss, metrics


# The share of response tokens whose correction weight was cut, by what cut it.
CORRECTED_SHARE = {"tis": "rollout_weight_truncated_frac", "mis": "rollout_weight_masked_frac"}


def _correction_metrics(
    correction: RolloutWeights, settings: RolloutCorrection, counted: Tensor
) -> dict[str, float]:
    """The weights' mean, the share truncated (tis) or masked (mis), and the raw ratio's
    extremes, over the counted response tokens (a sequence weight counts once per token)."""
    in_mask = counted > 0
    raw = correction.raw[in_mask]
    return {
        "rollout_weight_mean": _masked_mean(correction.weights, counted),
        CORRECTED_SHARE[settings.mode]: _masked_mean(correction.corrected.float(), counted),
        "rollout_weight_raw_max": float(raw.max()) if raw.numel() else 1.0,
        "rollout_weight_raw_min": float(raw.min()) if raw.numel() else 1.0,
    }
