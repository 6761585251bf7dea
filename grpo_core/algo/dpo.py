"""The DPO loss with its IPO and conservative (label-smoothed) forms, and the preference pairs
a step builds from its own groups, as pure functions (docs/algorithm.md section 12).

Shapes: P prompts, G outputs per prompt, B = P * G rows prompt-major, N pairs, T tokens.
A pair is marked on its rows by a side: +1 chosen, -1 rejected, 0 in no pair; each group
holds as many chosen as rejected rows, so the k-th chosen row of a batch pairs with its k-th
rejected row and a pair never spans two groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from grpo_core.algo.advantages import AdvantageInputs
from grpo_core.algo.dpo_config import DPOConfig, SequenceLogprob


def sequence_logprob(logp: Tensor, mask: Tensor, form: SequenceLogprob = "sum") -> Tensor:
    """(B,) log pi(o | q) of each row from its (B, T) token log-probs: the sum over its
    response tokens (`mean`: divided by their count); 0 for a row without any."""
    inside = mask > 0
    summed = torch.where(inside, logp, torch.zeros_like(logp)).sum(dim=-1)
    if form == "sum":
        return summed
    if form == "mean":
        return summed / inside.sum(dim=-1).clamp(min=1).to(summed.dtype)
    raise ValueError(f"sequence_logprob must be 'sum' or 'mean' (got {form!r})")


@dataclass(frozen=True)
class PreferenceTerms:
    """A batch of pairs' losses (N,) with grad, and each side's implicit reward
    beta * log(pi / pi_ref) (N,), detached: TRL's rewards/chosen and rewards/rejected."""

    losses: Tensor
    chosen_rewards: Tensor
    rejected_rewards: Tensor

    @property
    def margins(self) -> Tensor:
        """(N,) implicit reward of the chosen output minus the rejected one's."""
        return self.chosen_rewards - self.rejected_rewards


def preference_loss(
    policy_chosen: Tensor,
    policy_rejected: Tensor,
    ref_chosen: Tensor,
    ref_rejected: Tensor,
    settings: DPOConfig,
) -> PreferenceTerms:
    """Spec section 12, per pair (N,): with m = log(pi/pi_ref)(chosen) - log(pi/pi_ref)(rejected),
    sigmoid: -(1 - e) log sigmoid(beta m) - e log sigmoid(-beta m) (e: label_smoothing, 0 is
    DPO); ipo: (m - 1 / (2 beta))^2. Arguments are sequence log-probs (N,)."""
    beta = settings.beta
    chosen = policy_chosen - ref_chosen
    rejected = policy_rejected - ref_rejected
    margin = chosen - rejected
    if settings.loss == "sigmoid":
        eps = settings.label_smoothing
        losses = -F.logsigmoid(beta * margin)
        if eps > 0:
            losses = (1.0 - eps) * losses - eps * F.logsigmoid(-beta * margin)
    elif settings.loss == "ipo":
        losses = (margin - 1.0 / (2.0 * beta)) ** 2
    else:
        raise ValueError(f"dpo.loss must be 'sigmoid' or 'ipo' (got {settings.loss!r})")
    return PreferenceTerms(losses, beta * chosen.detach(), beta * rejected.detach())


def verifier_pairs(correct: Tensor, eligible: Tensor) -> Tensor:
    """(P, G) sides: per group, min(right, wrong) pairs of a right and a wrong output, the
    first of each in sample order; outputs not `eligible` (no response token) are in none."""
    right, wrong = (correct > 0) & eligible, (correct <= 0) & eligible
    count = torch.minimum(right.sum(dim=-1), wrong.sum(dim=-1)).unsqueeze(-1)
    chosen = right & (right.cumsum(dim=-1) <= count)
    rejected = wrong & (wrong.cumsum(dim=-1) <= count)
    return chosen.float() - rejected.float()


def ranked_pairs(scores: Tensor, eligible: Tensor) -> Tensor:
    """(P, G) sides by score: the k best eligible outputs chosen, the k worst rejected, k the
    most (at most half of them) that leaves every chosen scoring strictly above every rejected;
    equal scores keep sample order. A tie between the k-th best and k-th worst ends the pairs."""
    low = torch.finfo(scores.dtype).min
    ranked = torch.where(eligible, scores, torch.full_like(scores, low))
    order = torch.sort(ranked, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(
        -1, order, torch.arange(scores.shape[-1]).expand_as(order).contiguous()
    )
    ordered = scores.gather(-1, order)
    n = eligible.sum(dim=-1, keepdim=True)  # the eligible ones come first in `order`
    k = torch.zeros_like(n)
    for j in range(1, scores.shape[-1] // 2 + 1):  # strictly better for every j up to k
        worst = (n - j).clamp(min=0)
        better = (ordered[:, j - 1 : j] > ordered.gather(-1, worst)) & (n >= 2 * j)
        k = torch.where(better & (k == j - 1), torch.full_like(k, j), k)
    chosen = rank < k
    rejected = (rank >= n - k) & (rank < n)
    return chosen.float() - rejected.float()


def pair_rows(sides: Tensor) -> tuple[Tensor, Tensor]:
    """(N,) row indices of the chosen and of the rejected output of each pair, from (B,) sides:
    the k-th chosen row with the k-th rejected row."""
    chosen = (sides > 0).nonzero().flatten()
    rejected = (sides < 0).nonzero().flatten()
    if len(chosen) != len(rejected):
        raise ValueError(
            f"DPO pairs need as many chosen as rejected rows (got {len(chosen)} and "
            f"{len(rejected)}): build the sides with verifier_pairs or ranked_pairs"
        )
    return chosen, rejected


def row_sides(advantages: Tensor, mask: Tensor) -> Tensor:
    """(B,) side of each row from the (B, T) advantages a pairing estimator gave its tokens."""
    return torch.sign(torch.where(mask > 0, advantages, torch.zeros_like(advantages)).sum(-1))


def _sides_on_tokens(sides: Tensor, response_mask: Tensor) -> Tensor:
    return sides.reshape(-1, 1).to(torch.float32) * response_mask.to(torch.float32)


def _eligible(inputs: AdvantageInputs, shape: torch.Size) -> Tensor:
    """(P, G): outputs with a response token (an empty one has no log-prob to pair)."""
    return (inputs.response_mask.sum(dim=-1) > 0).reshape(shape)


def dpo_estimator(inputs: AdvantageInputs, eps: float) -> Tensor:
    """Spec section 12: pairs of a right and a wrong output of a group, by the verifier."""
    if inputs.correct is None:
        raise ValueError("advantage estimator 'dpo' needs AdvantageInputs.correct")
    sides = verifier_pairs(inputs.correct, _eligible(inputs, inputs.correct.shape))
    return _sides_on_tokens(sides, inputs.response_mask)


def dpo_ranked_estimator(inputs: AdvantageInputs, eps: float) -> Tensor:
    """Spec section 12: pairs of the best and the worst outputs of a group by the reward."""
    if inputs.rewards is None:
        raise ValueError("advantage estimator 'dpo_ranked' needs AdvantageInputs.rewards")
    sides = ranked_pairs(inputs.rewards, _eligible(inputs, inputs.rewards.shape))
    return _sides_on_tokens(sides, inputs.response_mask)


def dpo_file_estimator(inputs: AdvantageInputs, eps: float) -> Tensor:
    """Spec section 12, offline: each group is a stored pair, its first output chosen."""
    rows = inputs.response_mask.shape[0]
    if rows % 2:
        raise ValueError(f"stored pairs come as groups of 2 outputs (got {rows} rows)")
    sides = torch.tensor([1.0, -1.0]).repeat(rows // 2)
    return _sides_on_tokens(sides, inputs.response_mask)
