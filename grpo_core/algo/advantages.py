"""Advantage formulas (docs/algorithm.md sections 4-6) and the estimators built from them,
vectorised over groups (their names and needs: grpo_core/algo/estimators.py).

Shapes: P prompts, G outputs per prompt, S steps per output, T response tokens. Rows of a
flat batch are prompt-major (row r belongs to prompt r // G), as in RolloutBatch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeVar

import torch
from torch import Tensor

OutcomeScaling = Literal["group_std", "none"]
# How grpo_process credits a token from the normalised rewards of the steps at or after it:
# their sum (the paper) or their minimum (PURE); grpo.algo.process_credit's choices.
ProcessCredit = Literal["sum", "min"]
_V = TypeVar("_V")


def outcome_advantages(
    rewards: Tensor, scaling: OutcomeScaling = "group_std", eps: float = 1e-4
) -> Tensor:
    """Outcome advantages, spec section 4: (r - mean(r)) / (std(r) + eps) per group; (P, G)."""
    if scaling not in ("group_std", "none"):
        raise ValueError(f"outcome scaling must be 'group_std' or 'none' (got {scaling!r})")
    # float64: for near-equal rewards (learned-RM scores that differ in the 7th digit) the
    # float32 rounding of r - mean would be amplified by 1 / eps into visible noise.
    if rewards.numel() == 0:  # no group (a step without prompts): the std of nothing warns
        return torch.zeros_like(rewards)
    r = rewards.double()
    centred = r - r.mean(dim=-1, keepdim=True)
    # equal rewards: exactly 0 (float rounding of the mean would be amplified by 1 / eps)
    constant = r.amax(dim=-1, keepdim=True) == r.amin(dim=-1, keepdim=True)
    centred = torch.where(constant, torch.zeros_like(centred), centred)
    if scaling == "group_std":
        centred = centred / (r.std(dim=-1, unbiased=False, keepdim=True) + eps)
    return centred.to(rewards.dtype)


def zero_advantage_group_fraction(rewards: Tensor, tol: float = 1e-6) -> float:
    """Fraction of groups whose rewards are all equal (no policy gradient), spec section 4."""
    if rewards.numel() == 0:
        return 0.0
    spread = rewards.amax(dim=-1) - rewards.amin(dim=-1)
    return float((spread <= tol).float().mean())


def normalize_step_rewards(step_rewards: Tensor, step_mask: Tensor, eps: float = 1e-4) -> Tensor:
    """Spec section 5: z-score all step rewards of a group together (population std + eps).

    step_rewards, step_mask: (..., G, S); the statistics run over the last two dims.
    """
    mask = step_mask.to(step_rewards.dtype)
    count = mask.sum(dim=(-2, -1), keepdim=True).clamp(min=1.0)
    mean = (step_rewards * mask).sum(dim=(-2, -1), keepdim=True) / count
    var = (((step_rewards - mean) * mask) ** 2).sum(dim=(-2, -1), keepdim=True) / count
    valid = step_mask.bool()
    high = step_rewards.masked_fill(~valid, float("-inf")).amax(dim=(-2, -1), keepdim=True)
    low = step_rewards.masked_fill(~valid, float("inf")).amin(dim=(-2, -1), keepdim=True)
    centred = torch.where(high == low, torch.zeros_like(step_rewards), step_rewards - mean)
    return centred / (var.sqrt() + eps) * mask


def step_rewards_to_token_advantages(
    normed: Tensor, step_mask: Tensor, step_ends: Tensor, response_mask: Tensor
) -> Tensor:
    """Spec section 5: A_t = sum of normalised step rewards whose step ends at index >= t.

    normed, step_mask, step_ends: (..., S); response_mask: (..., T). Tokens after the last
    step end get 0.
    """
    num_tokens = response_mask.shape[-1]
    if num_tokens == 0:  # every output empty: no token to give an advantage to
        return torch.zeros(response_mask.shape, dtype=normed.dtype, device=normed.device)
    valid = step_mask.bool()
    if bool(((step_ends < 0) | (step_ends >= num_tokens))[valid].any()):
        raise ValueError(f"step end indices must lie in [0, {num_tokens}) (got {step_ends})")
    at_end = torch.zeros((*normed.shape[:-1], num_tokens), dtype=normed.dtype, device=normed.device)
    at_end.scatter_add_(-1, step_ends.clamp(0, num_tokens - 1).long(), normed * valid)
    suffix_sum = at_end.flip(-1).cumsum(-1).flip(-1)
    return suffix_sum * response_mask.to(normed.dtype)


def min_step_returns_to_token_advantages(
    normed: Tensor, step_mask: Tensor, step_ends: Tensor, response_mask: Tensor
) -> Tensor:
    """Min-form credit (PURE, Cheng et al. 2025): A_t = the minimum of the normalised step
    rewards whose step ends at index >= t, so the return of a step is its worst future step,
    and high-scoring steps cannot buy back a bad one as in the sum. Tokens after the last step
    end get 0. Shapes as step_rewards_to_token_advantages; the valid steps of a row come first
    with ascending ends (pad_steps' layout)."""
    num_tokens = response_mask.shape[-1]
    if num_tokens == 0:
        return torch.zeros(response_mask.shape, dtype=normed.dtype, device=normed.device)
    valid = step_mask.bool()
    if bool(((step_ends < 0) | (step_ends >= num_tokens))[valid].any()):
        raise ValueError(f"step end indices must lie in [0, {num_tokens}) (got {step_ends})")
    # the return of step j: min over valid steps j' >= j (+inf for padding, then 0)
    high = torch.full_like(normed, float("inf"))
    suffix_min = torch.where(valid, normed, high).flip(-1).cummin(-1).values.flip(-1)
    returns = torch.where(valid, suffix_min, torch.zeros_like(normed))
    returns = torch.cat([returns, torch.zeros_like(returns[..., :1])], dim=-1)
    # token t's first step ending at or after it: the count of valid steps ending before t
    positions = torch.arange(num_tokens, device=normed.device)
    ended_before = (step_ends.unsqueeze(-1) < positions) & valid.unsqueeze(-1)  # (..., S, T)
    first_step = ended_before.sum(-2)  # (..., T); = S' (no step left) after the last end
    return returns.gather(-1, first_step) * response_mask.to(normed.dtype)


def process_advantages(
    step_rewards: Tensor,
    step_mask: Tensor,
    step_ends: Tensor,
    response_mask: Tensor,
    eps: float = 1e-4,
    credit: ProcessCredit = "sum",
) -> Tensor:
    """Process advantages of P groups, spec section 5: (P, G, S) step rewards -> (P, G, T);
    `credit`: 'sum' (paper) or 'min' (PURE) over the steps ending at or after each token."""
    normed = normalize_step_rewards(step_rewards, step_mask, eps)
    if credit == "min":
        return min_step_returns_to_token_advantages(normed, step_mask, step_ends, response_mask)
    if credit != "sum":
        raise ValueError(f"process credit must be 'sum' or 'min' (got {credit!r})")
    return step_rewards_to_token_advantages(normed, step_mask, step_ends, response_mask)


def pad_steps(
    values: list[list[float]], ends: list[list[int]], shape: tuple[int, int]
) -> tuple[Tensor, Tensor, Tensor]:
    """Ragged per-output step rewards and step-end token indices (B = P * G lists) ->
    (P, G, S) rewards, valid-step mask and end indices, S the most steps of any output
    (at least 1); padding is 0 / False / 0."""
    if len(values) != len(ends) or len(values) != shape[0] * shape[1]:
        raise ValueError(
            f"{len(values)} step-reward lists and {len(ends)} step-end lists for a "
            f"{shape[0]} x {shape[1]} group batch"
        )
    width = max((len(v) for v in values), default=0) or 1
    rewards = torch.zeros(len(values), width)
    mask = torch.zeros(len(values), width, dtype=torch.bool)
    end_idx = torch.zeros(len(values), width, dtype=torch.long)
    for r, (vals, idx) in enumerate(zip(values, ends, strict=True)):
        if len(vals) != len(idx):
            raise ValueError(f"output {r}: {len(vals)} step rewards but {len(idx)} step ends")
        rewards[r, : len(vals)] = torch.tensor(vals, dtype=rewards.dtype)
        mask[r, : len(vals)] = True
        end_idx[r, : len(idx)] = torch.tensor(idx, dtype=torch.long)
    return (
        rewards.reshape(*shape, width),
        mask.reshape(*shape, width),
        end_idx.reshape(*shape, width),
    )


def pad_token_rewards(rewards: list[list[float]], width: int) -> Tensor:
    """Ragged per-output token rewards (one value per response token) as (B, width) in response
    coordinates, 0 on padding."""
    out = torch.zeros(len(rewards), width)
    for r, values in enumerate(rewards):
        if len(values) > width:
            raise ValueError(f"output {r}: {len(values)} token rewards for {width} token columns")
        out[r, : len(values)] = torch.tensor(values, dtype=out.dtype)
    return out


def sft_coefficients(correct: Tensor) -> Tensor:
    """SFT gradient coefficient, spec section 6: 1 for every output; shape of `correct`."""
    return torch.ones_like(correct, dtype=torch.float32)


def rft_coefficients(correct: Tensor) -> Tensor:
    """RFT / Online RFT gradient coefficient, spec section 6: 1 if correct else 0."""
    return correct.to(torch.float32)


@dataclass(frozen=True)
class PPOTerms:
    """What PPO's estimator reads besides the outcome reward (grpo_core/algo/ppo.py), in
    response coordinates (B, T): the critic's values V(s_t) before each response token, and
    log pi_old - log pi_ref of each token, which the KL penalty kl_coef scales into the
    per-token rewards; gamma and lam are GAE's discount and trace decay."""

    values: Tensor
    log_ratio: Tensor
    kl_coef: float
    gamma: float
    lam: float
    whiten: bool


@dataclass(frozen=True)
class AdvantageInputs:
    """Everything an estimator may read; B = P * G rows, prompt-major.

    response_mask: (B, T) response tokens in response coordinates (token t of output r).
    rewards, correct: (P, G) outcome rewards and verifier verdicts.
    step_rewards, step_mask, step_ends: (P, G, S) PRM step scores, valid steps, and the
    response-token index where each step ends.
    process_credit: 'sum' or 'min' over a token's future steps (grpo.algo.process_credit).
    ppo: the critic's values and the KL penalty's terms (only PPO reads them).
    token_rewards: (B, T) the weighted per-token reward parts' reward of each response token
    (0 on padding), e.g. a teacher's reverse KL (grpo_core/algo/distill.py).
    """

    response_mask: Tensor
    rewards: Tensor | None = None
    correct: Tensor | None = None
    step_rewards: Tensor | None = None
    step_mask: Tensor | None = None
    step_ends: Tensor | None = None
    process_credit: ProcessCredit = "sum"  # how step rewards become token advantages
    ppo: PPOTerms | None = None
    token_rewards: Tensor | None = None


def _require(value: _V | None, field: str, estimator: str) -> _V:
    if value is None:
        raise ValueError(f"advantage estimator {estimator!r} needs AdvantageInputs.{field}")
    return value


def _per_output_to_tokens(per_output: Tensor, response_mask: Tensor) -> Tensor:
    """Broadcast one value per output (P, G) to its response tokens (P*G, T)."""
    return per_output.reshape(-1, 1).to(torch.float32) * response_mask.to(torch.float32)


def grpo_outcome_estimator(inputs: AdvantageInputs, eps: float) -> Tensor:
    """Spec section 4 with the paper's group-std scaling."""
    rewards = _require(inputs.rewards, "rewards", "grpo_outcome")
    advantages = outcome_advantages(rewards, "group_std", eps)
    return _per_output_to_tokens(advantages, inputs.response_mask)


def dr_grpo_estimator(inputs: AdvantageInputs, eps: float) -> Tensor:
    """Spec section 4, Dr. GRPO variant: reward minus group mean, no std division."""
    rewards = _require(inputs.rewards, "rewards", "dr_grpo")
    return _per_output_to_tokens(outcome_advantages(rewards, "none"), inputs.response_mask)


def grpo_process_estimator(inputs: AdvantageInputs, eps: float) -> Tensor:
    """Spec section 5: group-normalised step rewards summed over later step ends."""
    step_rewards = _require(inputs.step_rewards, "step_rewards", "grpo_process")
    step_mask = _require(inputs.step_mask, "step_mask", "grpo_process")
    step_ends = _require(inputs.step_ends, "step_ends", "grpo_process")
    num_prompts, group_size, _ = step_rewards.shape
    response_mask = inputs.response_mask.reshape(num_prompts, group_size, -1)
    advantages = process_advantages(
        step_rewards, step_mask, step_ends, response_mask, eps, inputs.process_credit
    )
    return advantages.reshape(num_prompts * group_size, -1).to(torch.float32)


def rft_estimator(inputs: AdvantageInputs, eps: float) -> Tensor:
    """Spec section 6: RFT and Online RFT coefficient, 1 if correct else 0 (same formula)."""
    correct = _require(inputs.correct, "correct", "rft")
    return _per_output_to_tokens(rft_coefficients(correct), inputs.response_mask)


def sft_estimator(inputs: AdvantageInputs, eps: float) -> Tensor:
    """Spec section 6: SFT coefficient, 1 for every output whatever its verdict."""
    outputs = torch.zeros(inputs.response_mask.shape[0])
    return _per_output_to_tokens(sft_coefficients(outputs), inputs.response_mask)
