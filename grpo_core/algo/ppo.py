"""PPO with a critic, the algorithm GRPO is built against (docs/ppo.md, from the seeds' PPO
chapter): KL-shaped per-token rewards, GAE, returns, masked whitening, the clipped value loss
and the adaptive KL controller, as pure functions; and `ppo_estimator`, registered as the
`ppo` advantage estimator (grpo_core/algo/estimators.py).

Tensors are (B, T) in response coordinates: token t of output r, right-padded, `mask` 1 on
real tokens. V(s_t) is the critic's value of the prefix before token t.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from grpo_core.algo.advantages import AdvantageInputs, PPOTerms, _require

# Ziegler et al. (2019): the KL coefficient moves by at most this fraction of its error.
KL_ERROR_CLIP = 0.2
WHITEN_EPS = 1e-8


def kl_shaped_rewards(scores: Tensor, log_ratio: Tensor, mask: Tensor, kl_coef: float) -> Tensor:
    """Spec section 2, PPO: r_t = -kl_coef * log(pi_old / pi_ref) on every response token,
    plus the output's scalar reward on its last response token; (B,) scores -> (B, T)."""
    m = mask.to(log_ratio.dtype)
    rewards = -kl_coef * log_ratio * m
    lengths = m.sum(dim=-1).long()
    rows = torch.nonzero(lengths > 0, as_tuple=True)[0]
    rewards[rows, lengths[rows] - 1] += scores.to(rewards.dtype)[rows]
    return rewards


def gae_advantages(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> Tensor:
    """Generalised advantage estimation: delta_t = r_t + gamma V(s_{t+1}) - V(s_t),
    A_t = delta_t + gamma lam A_{t+1}; after an output's last token V = 0 and A = 0 (the
    episode ends). Padding gets 0."""
    m = mask.to(values.dtype)
    num_tokens = rewards.shape[-1]
    advantages = torch.zeros_like(values)
    carried = torch.zeros_like(values[:, 0]) if num_tokens else values.new_zeros(0)
    for t in reversed(range(num_tokens)):
        next_value = values[:, t + 1] * m[:, t + 1] if t + 1 < num_tokens else 0.0
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        carried = (delta + gamma * lam * carried) * m[:, t]
        advantages[:, t] = carried
    return advantages


def masked_whiten(x: Tensor, mask: Tensor) -> Tensor:
    """(x - mean) / sqrt(var + 1e-8) over the masked entries (population variance); 0 on
    padding."""
    m = mask.to(x.dtype)
    count = m.sum().clamp(min=1.0)
    mean = (x * m).sum() / count
    var = (((x - mean) * m) ** 2).sum() / count
    return (x - mean) * torch.rsqrt(var + WHITEN_EPS) * m


@dataclass(frozen=True)
class PPOTargets:
    """GAE advantages (not whitened) and the critic's regression targets, returns = A + V."""

    advantages: Tensor
    returns: Tensor


def ppo_targets(terms: PPOTerms, scores: Tensor, mask: Tensor) -> PPOTargets:
    """Per-token rewards from the scalar `scores` (B,) and the KL penalty, then GAE."""
    values = terms.values.to(torch.float32)
    rewards = kl_shaped_rewards(scores, terms.log_ratio.to(torch.float32), mask, terms.kl_coef)
    advantages = gae_advantages(rewards, values, mask, terms.gamma, terms.lam)
    return PPOTargets(advantages, (advantages + values) * mask.to(torch.float32))


def ppo_estimator(inputs: AdvantageInputs, eps: float) -> Tensor:
    """PPO's token advantages: GAE on KL-shaped rewards, whitened over the batch if asked."""
    terms = _require(inputs.ppo, "ppo", "ppo")
    scores = _require(inputs.rewards, "rewards", "ppo").reshape(-1)
    advantages = ppo_targets(terms, scores, inputs.response_mask).advantages
    return masked_whiten(advantages, inputs.response_mask) if terms.whiten else advantages


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float,
    num_tokens: Tensor | float | None = None,
) -> tuple[Tensor, Tensor]:
    """(loss, clipped fraction): 0.5 * token-mean of max((V - R)^2, (V_clip - R)^2) with
    V_clip = V_old + clamp(V - V_old, -clip, clip), so a value cannot gain by moving more
    than `clip` from what it was at sampling. num_tokens: the token-mean's divisor (the
    mini-batch's, when this is one micro-batch of it; default: this mask's tokens)."""
    m = mask.to(values.dtype)
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    unclipped_error = (values - returns) ** 2
    clipped_error = (clipped - returns) ** 2
    divisor = m.sum().clamp(min=1.0) if num_tokens is None else num_tokens
    loss = 0.5 * (torch.maximum(unclipped_error, clipped_error) * m).sum() / divisor
    binds = ((clipped_error > unclipped_error).to(values.dtype) * m).sum() / divisor
    return loss, binds


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 - Var(R - V) / Var(R) over the masked tokens: 1 is a perfect critic, 0 one no
    better than the mean return; NaN when the returns do not vary."""
    m = mask.to(torch.float64)
    count = m.sum().clamp(min=1.0)

    def variance(x: Tensor) -> Tensor:
        x = x.to(torch.float64)
        mean = (x * m).sum() / count
        return (((x - mean) * m) ** 2).sum() / count

    spread = variance(returns)
    if float(spread) == 0.0:
        return float("nan")
    return float(1.0 - variance(returns - values) / spread)


def adaptive_kl_coef(
    coef: float, current_kl: float, target_kl: float, horizon: int, n_steps: int
) -> float:
    """Ziegler et al. (2019): coef * (1 + e * n_steps / horizon), e = clip(KL / target - 1,
    -0.2, 0.2): the coefficient grows while the policy drifts past the target KL and shrinks
    while it stays closer."""
    error = min(max(current_kl / target_kl - 1.0, -KL_ERROR_CLIP), KL_ERROR_CLIP)
    return coef * (1.0 + error * n_steps / horizon)


def sequence_kl(log_ratio: Tensor, mask: Tensor) -> float:
    """Mean over outputs of the summed per-token log(pi_old / pi_ref): what the adaptive KL
    controller compares with its target."""
    if log_ratio.shape[0] == 0:
        return 0.0
    return float((log_ratio * mask.to(log_ratio.dtype)).sum(dim=-1).mean())


def token_kl(log_ratio: Tensor, mask: Tensor) -> float:
    """Mean over response tokens of log(pi_old / pi_ref): the per-token KL estimate the reward
    penalty scales by kl_coef (k1, the unit of GRPO's per-token loss term); 0 without tokens."""
    m = mask.to(log_ratio.dtype)
    return float((log_ratio * m).sum() / m.sum().clamp(min=1.0))
