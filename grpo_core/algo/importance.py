"""Importance ratios of the GRPO loss: the policy ratio at token, sequence (GSPO) or GSPO-token
level, and the rollout correction's weights pi_old / pi_sampler (TIS, MIS), as pure functions
(docs/algorithm.md sections 10-11).

Tensors are (B, T) and aligned; `mask` marks response tokens, the only ones any ratio reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from grpo_core.algo.importance_config import ImportanceSampling, RolloutCorrection

# Log-ratios are clamped to this range before exp() so one wild token cannot overflow.
MAX_LOG_RATIO = 20.0


def token_ratio(logp: Tensor, old_logp: Tensor) -> Tensor:
    """pi_theta / pi_old per token, spec section 1."""
    return torch.exp((logp - old_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))


def sequence_log_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """(B,) mean of a row's per-token log-ratios over its response tokens, spec section 10
    (GSPO's log s_i); 0 for a row without response tokens."""
    inside = mask > 0
    summed = torch.where(inside, log_ratio, torch.zeros_like(log_ratio)).sum(dim=-1)
    return summed / inside.sum(dim=-1).clamp(min=1).to(log_ratio.dtype)


def policy_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor, level: ImportanceSampling) -> Tensor:
    """The (B, T) ratio the clipped surrogate uses, spec section 10.

    token: exp(logp - old_logp) per token. sequence: GSPO's s_i = exp(mean over the row's
    response tokens of logp - old_logp) on every position of the row; its gradient reaches
    every token of the row through the mean. sequence_token: GSPO-token, sg[s_i] * pi / sg[pi]:
    s_i's value, each token's own gradient (s_i * grad log pi_t)."""
    if level == "token":
        return token_ratio(logp, old_logp)
    log_s = sequence_log_ratio(logp - old_logp, mask).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    if level == "sequence":
        return torch.exp(log_s)[:, None].expand_as(logp)
    if level == "sequence_token":
        return torch.exp(log_s.detach()[:, None] + logp - logp.detach())
    raise ValueError(
        f"importance_sampling must be 'token', 'sequence' or 'sequence_token' (got {level!r})"
    )


@dataclass(frozen=True)
class RolloutWeights:
    """The correction's (B, T) weights (no grad) and what made them: the raw ratio
    pi_old / pi_sampler before truncation or masking, and where it was truncated (tis) or
    masked (mis)."""

    weights: Tensor
    raw: Tensor
    corrected: Tensor  # bool: the weight differs from the raw ratio


def rollout_weights(
    old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, correction: RolloutCorrection
) -> RolloutWeights:
    """pi_old / pi_sampler, detached, spec section 11: per token (level token) or the product
    over the row's response tokens on all of them (level sequence); tis caps it at `cap`, mis
    zeroes it outside [1/cap, cap]; off gives 1 everywhere. A row without response tokens
    gets 1."""
    with torch.no_grad():
        inside = mask > 0
        log_w = torch.where(inside, old_logp - sampler_logp, torch.zeros_like(old_logp))
        if correction.level == "sequence":
            log_w = log_w.sum(dim=-1, keepdim=True).expand_as(log_w)
        raw = torch.exp(log_w.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
        cap = correction.cap
        if correction.mode == "off":
            return RolloutWeights(torch.ones_like(raw), raw, torch.zeros_like(inside))
        if correction.mode == "tis":
            corrected = raw > cap
            return RolloutWeights(raw.clamp(max=cap), raw, corrected)
        if correction.mode == "mis":
            corrected = (raw > cap) | (raw < 1.0 / cap)
            return RolloutWeights(torch.where(corrected, 0.0, raw), raw, corrected)
    raise ValueError(
        f"rollout_correction.mode must be 'off', 'tis' or 'mis' (got {correction.mode!r})"
    )
