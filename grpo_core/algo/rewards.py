"""Reward rules of a GRPO step: how the parts of a reward combine, where process supervision
puts the outcome part, what is recorded of them, and how rewards become token advantages.

Pure functions of tensors and lists; who computes the parts (the verifier, the learned
reward models, ...: the reward-part registry of reward_models/parts/) is the caller's business.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from grpo_core.algo.advantages import (
    AdvantageInputs,
    PPOTerms,
    pad_steps,
    pad_token_rewards,
    zero_advantage_group_fraction,
)
from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.estimators import VERIFIER
from grpo_core.contracts.numerics import REWARD_SOURCE, require_finite


@dataclass(frozen=True)
class ScoredPart:
    """One reward part's (B,) scores with its weight; `learned`: a reward model's opinion."""

    weight: float
    score: Tensor
    learned: bool = False


@dataclass
class StepRewards:
    """Rewards of one GRPO step's P x G outputs (flattened prompt-major)."""

    total: Tensor  # (B,) weighted outcome reward (under PS: added to the last step)
    parts: dict[str, Tensor]  # (B,) score of each part computed, by name; VERIFIER always
    rm: Tensor | None  # (B,) what the learned RMs gave each output (None: no RM used)
    step_scores: list[list[float]] | None = None  # per-step rewards (process supervision)
    step_ends: list[list[int]] | None = None  # index into the completion tokens per step
    # per response token of each output: the weighted sum of the per-token parts (a teacher's
    # reverse KL); None: no per-token part was scored
    token_rewards: list[list[float]] | None = None

    def __post_init__(self) -> None:
        if VERIFIER not in self.parts:
            raise ValueError(
                f"StepRewards.parts needs the {VERIFIER!r} part (got {list(self.parts)})"
            )

    @property
    def verifier(self) -> Tensor:
        """(B,) 1/0: the checked answer of each output."""
        return self.parts[VERIFIER]

    @property
    def per_output(self) -> Tensor:
        """The reward each output received: the outcome reward, plus under process supervision
        its mean PRM step score (the step rewards without the outcome part)."""
        if self.step_scores is None or self.rm is None:
            return self.total
        return self.total + self.rm


def outcome_reward(parts: Sequence[ScoredPart]) -> tuple[Tensor, Tensor | None]:
    """(total, rm): total = sum of weight x score over the parts, in their order; rm = the
    weighted mean of the learned parts (what the reward models said of each output), None
    without any."""
    if not parts:
        raise ValueError("an outcome reward needs at least one scored part")
    total = parts[0].weight * parts[0].score.float()
    for part in parts[1:]:  # in order: the same sum, bit for bit, on every run
        total = total + part.weight * part.score.float()
    learned = [p for p in parts if p.learned]
    if not learned:
        return total, None
    weighted = torch.stack([p.weight * p.score.float() for p in learned]).sum(0)
    return total, weighted / sum(p.weight for p in learned)


def token_rewards(
    parts: Sequence[tuple[float, Sequence[Sequence[float]]]],
) -> list[list[float]] | None:
    """The per-token reward of each response token: the sum of weight x token score over the
    per-token parts (weight, one list per output), in their order; None without any."""
    if not parts:
        return None
    weight, first = parts[0]
    total = [[weight * v for v in row] for row in first]
    for weight, scores in parts[1:]:
        if [len(r) for r in scores] != [len(r) for r in total]:
            raise ValueError("per-token parts must score the same tokens of the same outputs")
        total = [
            [t + weight * v for t, v in zip(trow, srow, strict=True)]
            for trow, srow in zip(total, scores, strict=True)
        ]
    return total


def process_rewards(
    step_scores: Sequence[Sequence[float]],
    step_ends: Sequence[Sequence[int]],
    outcome: Tensor,
    parts: dict[str, Tensor],
) -> StepRewards:
    """Process supervision (docs/algorithm.md section 5): each output's PRM step scores are its step
    rewards, with its outcome reward added to the last step so a process-supervised run can
    still be anchored to the checked answer. `rm` is the mean step score of each output."""
    if len(step_scores) != len(step_ends) or len(step_scores) != len(outcome):
        raise ValueError(
            f"need step scores, step ends and an outcome reward per output (got "
            f"{len(step_scores)}, {len(step_ends)}, {len(outcome)})"
        )
    for row, (scores, ends) in enumerate(zip(step_scores, step_ends, strict=True)):
        if len(scores) != len(ends):
            raise ValueError(
                f"GRPO output {row}: the PRM found {len(scores)} steps but the policy's tokens "
                f"{len(ends)}; the two tokenizers decode the output differently"
            )
    with_outcome = [
        [*s[:-1], s[-1] + float(extra)] if s else []
        for s, extra in zip(step_scores, outcome.tolist(), strict=True)
    ]
    step_mean = torch.tensor([sum(s) / len(s) if s else 0.0 for s in step_scores])
    return StepRewards(outcome, parts, step_mean, with_outcome, [list(e) for e in step_ends])


def reward_stats(rewards: StepRewards, group_size: int) -> dict[str, float]:
    """Per-step reward metrics: what was used, what the learned RMs gave, what the verifier
    says of the same samples (rm_reward_mean - verifier_accuracy is the over-optimisation gap),
    and the share of groups whose outputs all got the same reward (no outcome gradient)."""
    stats = {
        "reward_mean": float(rewards.per_output.mean()),
        "verifier_accuracy": float(rewards.verifier.mean()),
        "equal_reward_groups": zero_advantage_group_fraction(
            rewards.per_output.reshape(-1, group_size)
        ),
    }
    if rewards.rm is not None:
        stats["rm_reward_mean"] = float(rewards.rm.mean())
    tokens = [r for row in rewards.token_rewards or [] for r in row]
    if tokens:  # the mean over every response token (a teacher's: minus the reverse KL)
        stats["token_reward_mean"] = sum(tokens) / len(tokens)
    return stats


def check_rewards(rewards: StepRewards, where: str) -> None:
    """Every reward of a step finite, the learned ones named first (the usual culprit)."""
    if rewards.rm is not None:
        require_finite("the reward models' reward", rewards.rm, where=where, cause=REWARD_SOURCE)
    for n, steps in enumerate(rewards.step_scores or []):
        require_finite(f"PRM step rewards of output {n}", steps, where=where, cause=REWARD_SOURCE)
    for n, tokens in enumerate(rewards.token_rewards or []):
        require_finite(f"token rewards of output {n}", tokens, where=where, cause=REWARD_SOURCE)
    require_finite("the weighted reward", rewards.total, where=where, cause=REWARD_SOURCE)


def token_advantages(
    algo: GRPOConfig,
    rewards: StepRewards,
    response_mask: Tensor,
    shape: tuple[int, int],
    ppo: PPOTerms | None = None,
) -> Tensor:
    """(B, T) advantages in response coordinates from algo.adv_estimator; shape = (P, G);
    `ppo`: the critic's values and the KL terms, for an estimator that reads values."""
    steps: dict[str, Tensor] = {}
    if rewards.step_scores is not None and rewards.step_ends is not None:
        step_rewards, step_mask, step_ends = pad_steps(
            rewards.step_scores, rewards.step_ends, shape
        )
        steps = {"step_rewards": step_rewards, "step_mask": step_mask, "step_ends": step_ends}
    per_token = None
    if rewards.token_rewards is not None:
        per_token = pad_token_rewards(rewards.token_rewards, response_mask.shape[-1])
    inputs = AdvantageInputs(
        response_mask=response_mask,
        rewards=rewards.total.reshape(shape),
        correct=rewards.verifier.reshape(shape),
        process_credit=algo.process_credit,
        ppo=ppo,
        token_rewards=per_token,
        **steps,
    )
    return algo.estimator.fn(inputs, algo.adv_eps)
