"""One GRPO step (paper Algorithm 1, one pass of its inner loop): sample G outputs per prompt,
reward them, turn rewards into token advantages, update the policy, report metrics.

The GRPO stage (flows/stages/grpo.py) and the step benchmark (bench/grpo_step.py) both call
`grpo_step`; what differs between them (the engines, the reward, checkpoints and rows) is
passed in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.rewards import StepRewards, check_rewards, reward_stats, token_advantages
from grpo_core.contracts.numerics import (
    DIVERGED,
    REWARD_SOURCE,
    require_finite,
    require_finite_metrics,
)
from grpo_core.contracts.policy_batch import PolicyBatch, build_policy_batch
from grpo_core.contracts.rollout import RolloutBatch, Sampler, SamplingParams

RewardFn = Callable[[RolloutBatch], StepRewards]


class PolicyUpdate(Protocol):
    """The policy update of a step (grpo_update on some engine, in process or launched)."""

    def update(
        self, batch: PolicyBatch, advantages: Tensor, old_logprobs: Tensor | None, seed: int
    ) -> dict[str, float]:
        """Update on CPU tensors (B, L); returns the update's metrics."""
        ...


@dataclass
class StepOutcome:
    """What a step sampled, how it was rewarded, and what the update reported."""

    batch: RolloutBatch
    rewards: StepRewards
    advantages: Tensor  # (B, T) in response coordinates: token t of output r
    stats: dict[str, float]  # the update's metrics and reward_stats


def grpo_step(
    prompts: list[str],
    sampler: Sampler,
    reward: RewardFn,
    policy: PolicyUpdate,
    algo: GRPOConfig,
    *,
    group_size: int,
    max_new_tokens: int,
    pad_token_id: int,
    seed: int,
    where: str = "GRPO step",
) -> StepOutcome:
    """Sample `group_size` outputs for each prompt with `seed`, reward them, compute
    algo.adv_estimator's advantages and run `policy.update`; every value a step produces is
    checked finite (`where` names the step in the error)."""
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=algo.temperature)
    batch = sampler.generate(prompts, group_size, params, seed=seed)
    sampled = [lp for row in batch.logprobs for lp in row]
    require_finite("the policy's sampling log-probs", sampled, where=where, cause=DIVERGED)
    rewards = reward(batch)
    check_rewards(rewards, where)
    # Advantages are computed on the CPU in response coordinates, then placed at the
    # completion columns of the padded batch (B, L) the update consumes.
    padded = build_policy_batch(batch.prompt_ids, batch.completion_ids, pad_token_id)
    response_mask = padded.full_to_response(padded.response_mask)
    advantages = token_advantages(algo, rewards, response_mask, (len(prompts), group_size))
    require_finite("advantages", advantages, where=where, cause=REWARD_SOURCE)
    old = padded.lists_to_full(batch.logprobs) if algo.use_sampling_logprobs_as_old else None
    stats = policy.update(padded, padded.response_to_full(advantages), old, seed)
    stats.update(reward_stats(rewards, group_size))
    require_finite_metrics(stats, where=where, cause=DIVERGED)
    return StepOutcome(batch, rewards, advantages, stats)
