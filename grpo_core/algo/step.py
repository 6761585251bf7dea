"""One GRPO step (paper Algorithm 1, one pass of its inner loop): sample G outputs per prompt,
reward them, turn rewards into token advantages, update the policy, report metrics.

The GRPO stage (flows/stages/grpo.py) and the step benchmark (bench/grpo_step.py) both call
`grpo_step`; what differs between them (the engines, the reward, checkpoints and rows) is
passed in. A degenerate batch (no prompt to draw, no response token to learn from) is a
skipped step with its reason in the metrics, never a NaN or an exception.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from grpo_core.algo.advantages import PPOTerms
from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.estimators import VERIFIER
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

# Why a step made no update; stored as metric rows `skipped` = 1 and `skipped_<reason>` = 1.
NO_PROMPTS = "no_prompts"
NO_RESPONSE_TOKENS = "no_response_tokens"
SKIPPED = "skipped"
SKIP_EXPLAINED = {
    NO_PROMPTS: "the task has no train problem for this step",
    NO_RESPONSE_TOKENS: "every output is empty, so no token has a log-prob to train",
}


class PolicyUpdate(Protocol):
    """The policy update of a step (grpo_update on some engine, in process or launched)."""

    def update(
        self, batch: PolicyBatch, advantages: Tensor, old_logprobs: Tensor | None, seed: int
    ) -> dict[str, float]:
        """Update on CPU tensors (B, L); returns the update's metrics."""
        ...


class ValueLearner(Protocol):
    """A critic trained beside the policy (PPO: grpo_core/algo/critic_update.py)."""

    def prepare(self, batch: PolicyBatch) -> PPOTerms:
        """Values and KL terms of a CPU batch before the policy update."""
        ...

    def update(
        self, batch: PolicyBatch, terms: PPOTerms, scores: Tensor, seed: int
    ) -> dict[str, float]:
        """Train on the batch towards the returns of `terms` and the (B,) rewards; metrics."""
        ...


@dataclass
class StepOutcome:
    """What a step sampled, how it was rewarded, and what the update reported."""

    batch: RolloutBatch
    rewards: StepRewards
    advantages: Tensor  # (B, T) in response coordinates: token t of output r
    stats: dict[str, float]  # the update's metrics and reward_stats
    skipped: str | None = None  # why no update was made (NO_PROMPTS, ...); None: it was


def step_prompt_indices(pool_size: int, step: int, per_step: int) -> list[int]:
    """Indices into a pool of `pool_size` problems of step `step`'s prompts: the next
    `per_step` in order, wrapping round a pool too small for every step, never one twice in a
    step (a pool smaller than `per_step` gives every step the whole pool: fewer prompts)."""
    count = min(per_step, pool_size)
    return [(step * per_step + i) % pool_size for i in range(count)]


def skip_reason(num_prompts: int, response_tokens: int) -> str | None:
    """Why a step's batch cannot update the policy, None if it can: no prompt (a pool too small
    for the step), or no response token in any output (nothing has a log-prob to train)."""
    if num_prompts == 0:
        return NO_PROMPTS
    if response_tokens == 0:
        return NO_RESPONSE_TOKENS
    return None


def skip_stats(reason: str) -> dict[str, float]:
    """The metrics of a step skipped for `reason`."""
    return {SKIPPED: 1.0, f"{SKIPPED}_{reason}": 1.0}


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
    critic: ValueLearner | None = None,
) -> StepOutcome:
    """Sample `group_size` outputs for each prompt with `seed`, reward them, compute
    algo.adv_estimator's advantages and run `policy.update`; every value a step produces is
    checked finite (`where` names the step in the error). A batch `skip_reason` refuses makes
    no update: its outcome has zero advantages and `skipped` set. An estimator that reads
    values (PPO) takes them from `critic`, which then trains on the same batch."""
    if not prompts:
        empty = RolloutBatch([], [], [], [], [], [])
        no_rewards = StepRewards(torch.zeros(0), {VERIFIER: torch.zeros(0)}, None)
        return StepOutcome(empty, no_rewards, torch.zeros(0, 0), skip_stats(NO_PROMPTS), NO_PROMPTS)
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
    skipped = skip_reason(len(prompts), int(response_mask.sum()))
    if skipped is not None:
        stats = {**skip_stats(skipped), **reward_stats(rewards, group_size)}
        require_finite_metrics(stats, where=where, cause=REWARD_SOURCE)
        return StepOutcome(batch, rewards, torch.zeros(response_mask.shape), stats, skipped)
    terms = None
    if algo.estimator.needs_values:
        if critic is None:
            raise ValueError(f"advantage estimator {algo.adv_estimator!r} needs a critic")
        terms = critic.prepare(padded)
    shape = (len(prompts), group_size)
    advantages = token_advantages(algo, rewards, response_mask, shape, terms)
    require_finite("advantages", advantages, where=where, cause=REWARD_SOURCE)
    old = padded.lists_to_full(batch.logprobs) if algo.use_sampling_logprobs_as_old else None
    stats = policy.update(padded, padded.response_to_full(advantages), old, seed)
    if critic is not None and terms is not None:
        stats.update(critic.update(padded, terms, rewards.total, seed))
    stats.update(reward_stats(rewards, group_size))
    require_finite_metrics(stats, where=where, cause=DIVERGED)
    return StepOutcome(batch, rewards, advantages, stats)
