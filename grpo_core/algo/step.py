"""One GRPO step (paper Algorithm 1, one pass of its inner loop): sample G outputs per prompt,
reward them, turn rewards into token advantages, update the policy, report metrics.

The GRPO stage (flows/stages/grpo.py) and the step benchmark (bench/grpo_step.py) both call
`grpo_step`; what differs between them (the engines, the reward, checkpoints and rows) is
passed in. A degenerate batch (no prompt to draw, no response token to learn from) is a
skipped step with its reason in the metrics, never a NaN or an exception.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

import torch
from torch import Tensor

from grpo_core.algo.advantages import PPOTerms
from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.dynamic_sampling import SampledRound, round_seed, sample_informative_groups
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
# more_prompts(round, count): up to `count` further prompts for extra sampling round `round`
# (dynamic sampling) and their reward function; no prompt when the source has none left.
MorePrompts = Callable[[int, int], tuple[list[str], RewardFn]]

# Why a step made no update; stored as metric rows `skipped` = 1 and `skipped_<reason>` = 1.
NO_PROMPTS = "no_prompts"
NO_RESPONSE_TOKENS = "no_response_tokens"
ALL_TRUNCATED = "all_truncated"
ALL_GROUPS_EQUAL = "all_groups_equal"
SKIPPED = "skipped"
SKIP_EXPLAINED = {
    NO_PROMPTS: "the task has no train problem for this step",
    NO_RESPONSE_TOKENS: "every output is empty, so no token has a log-prob to train",
    ALL_TRUNCATED: "every output was cut at max_new_tokens and grpo.algo.mask_truncated "
    "leaves such outputs out of the loss",
    ALL_GROUPS_EQUAL: "under grpo.algo.dynamic_sampling every group drawn had equal rewards "
    "(raise dynamic_sampling_max_rounds, or check the reward)",
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
    # Under dynamic sampling: the position of each group of `batch` among all prompts the
    # step drew (the first round's prompts, then each extra round's); None: the prompts given.
    kept_prompts: list[int] | None = None

    @property
    def truncated(self) -> list[bool]:
        """Whether each output was cut at max_new_tokens."""
        return [reason == "length" for reason in self.batch.finish_reasons]


def step_prompt_indices(pool_size: int, step: int, per_step: int) -> list[int]:
    """Indices into a pool of `pool_size` problems of step `step`'s prompts: the next
    `per_step` in order, wrapping round a pool too small for every step, never one twice in a
    step (a pool smaller than `per_step` gives every step the whole pool: fewer prompts)."""
    return prompt_indices_at(pool_size, step * per_step, per_step)


def prompt_indices_at(pool_size: int, cursor: int, count: int) -> list[int]:
    """The `count` pool indices from prompt cursor `cursor` on, wrapping round the pool, never
    one twice (at most the whole pool). A stage without extra sampling rounds has its cursor
    at step * per_step, so this is step_prompt_indices."""
    return [(cursor + i) % pool_size for i in range(min(count, pool_size))]


def skip_reason(num_prompts: int, response_tokens: int) -> str | None:
    """Why a step's batch cannot update the policy, None if it can: no prompt (a pool too small
    for the step), or no response token in any output (nothing has a log-prob to train)."""
    if num_prompts == 0:
        return NO_PROMPTS
    if response_tokens == 0:
        return NO_RESPONSE_TOKENS
    return None


def length_stats(lengths: Tensor, correct: Tensor, truncated: Tensor) -> dict[str, float]:
    """Length diagnostics of a step's outputs (B,): the share cut at max_new_tokens, and the
    mean length in tokens of the correct and of the wrong ones (each left out when the step
    has no such output: a mean of nothing is undefined, not 0)."""
    stats = {"truncated_fraction": float(truncated.float().mean()) if len(truncated) else 0.0}
    right = correct > 0
    for name, rows in (("length_correct_mean", right), ("length_wrong_mean", ~right)):
        if bool(rows.any()):
            stats[name] = float(lengths[rows].float().mean())
    return stats


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
    more_prompts: MorePrompts | None = None,
    critic: ValueLearner | None = None,
) -> StepOutcome:
    """Sample `group_size` outputs for each prompt with `seed`, reward them, compute
    algo.adv_estimator's advantages and run `policy.update`; every value a step produces is
    checked finite (`where` names the step in the error). A batch `skip_reason` refuses makes
    no update: its outcome has zero advantages and `skipped` set. Under algo.dynamic_sampling
    groups of equal rewards are dropped and `more_prompts` asked for more (none given: no
    extra round); algo.mask_truncated leaves outputs cut at max_new_tokens out of the loss.
    An estimator that reads values (PPO) takes them from `critic`, which then trains on the
    same batch."""
    if not prompts:
        empty = RolloutBatch([], [], [], [], [], [])
        return StepOutcome(
            empty, rewards_of_nothing(), torch.zeros(0, 0), skip_stats(NO_PROMPTS), NO_PROMPTS
        )
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=algo.temperature)
    sampled = _sample_and_reward(
        prompts, sampler, reward, algo, params, group_size, seed, where, more_prompts
    )
    batch, rewards, kept, extra = sampled.batch, sampled.rewards, sampled.kept, sampled.stats
    num_prompts = len(prompts) if kept is None else len(kept)
    # Advantages are computed on the CPU in response coordinates, then placed at the
    # completion columns of the padded batch (B, L) the update consumes.
    padded = build_policy_batch(batch.prompt_ids, batch.completion_ids, pad_token_id)
    response_mask = padded.full_to_response(padded.response_mask)
    truncated = torch.tensor([r == "length" for r in batch.finish_reasons], dtype=torch.bool)
    lengths = torch.tensor([len(ids) for ids in batch.completion_ids])
    extra.update(length_stats(lengths, rewards.verifier, truncated))
    # Truncated rows leave the loss by their mask: no token of theirs enters any sum or mean
    # of the update (a zero advantage alone would still count them in the normalisers).
    trained = padded
    if algo.mask_truncated:
        kept_rows = (~truncated).to(padded.response_mask.dtype).reshape(-1, 1)
        trained = replace(padded, response_mask=padded.response_mask * kept_rows)
    skipped = sampled.forced or skip_reason(num_prompts, int(response_mask.sum()))
    if skipped is None and int(trained.response_mask.sum()) == 0:
        skipped = ALL_TRUNCATED
    if skipped is not None:
        stats = {**skip_stats(skipped), **reward_stats(rewards, group_size), **extra}
        require_finite_metrics(stats, where=where, cause=REWARD_SOURCE)
        return StepOutcome(batch, rewards, torch.zeros(response_mask.shape), stats, skipped, kept)
    terms = None
    if algo.estimator.needs_values:
        if critic is None:
            raise ValueError(f"advantage estimator {algo.adv_estimator!r} needs a critic")
        terms = critic.prepare(trained)
    shape = (num_prompts, group_size)
    advantages = token_advantages(algo, rewards, response_mask, shape, terms)
    require_finite("advantages", advantages, where=where, cause=REWARD_SOURCE)
    if algo.mask_truncated:
        advantages = advantages * (~truncated).to(advantages.dtype).reshape(-1, 1)
    old = padded.lists_to_full(batch.logprobs) if algo.use_sampling_logprobs_as_old else None
    stats = policy.update(trained, trained.response_to_full(advantages), old, seed)
    if critic is not None and terms is not None:
        stats.update(critic.update(trained, terms, rewards.total, seed))
    stats.update(reward_stats(rewards, group_size))
    stats.update(extra)
    require_finite_metrics(stats, where=where, cause=DIVERGED)
    return StepOutcome(batch, rewards, advantages, stats, None, kept)


def rewards_of_nothing() -> StepRewards:
    """The rewards of an empty batch."""
    return StepRewards(torch.zeros(0), {VERIFIER: torch.zeros(0)}, None)


@dataclass
class _Sampled:
    """A step's batch after sampling and rewarding (and dynamic sampling's choice of groups)."""

    batch: RolloutBatch
    rewards: StepRewards
    kept: list[int] | None  # StepOutcome.kept_prompts
    forced: str | None  # a skip decided before the batch is looked at
    stats: dict[str, float]  # dynamic sampling's metrics


def _sample_and_reward(
    prompts: list[str],
    sampler: Sampler,
    reward: RewardFn,
    algo: GRPOConfig,
    params: SamplingParams,
    group_size: int,
    seed: int,
    where: str,
    more_prompts: MorePrompts | None,
) -> _Sampled:
    """Sample and reward the step's prompts; under algo.dynamic_sampling keep the groups of
    unequal rewards, drawing further rounds from `more_prompts` (none given: no extra round)."""
    rounds: list[SampledRound] = []

    def draw(round_index: int, count: int) -> SampledRound:
        round_prompts, round_reward = prompts, reward
        if round_index > 0:
            round_prompts, round_reward = (
                more_prompts(round_index, count) if more_prompts else ([], reward)
            )
        if not round_prompts:
            return SampledRound(0, RolloutBatch([], [], [], [], [], []), rewards_of_nothing())
        batch = sampler.generate(
            round_prompts, group_size, params, seed=round_seed(seed, round_index)
        )
        sampled = [lp for row in batch.logprobs for lp in row]
        require_finite("the policy's sampling log-probs", sampled, where=where, cause=DIVERGED)
        rewards = round_reward(batch)
        check_rewards(rewards, where)
        rounds.append(SampledRound(len(round_prompts), batch, rewards))
        return rounds[-1]

    if not algo.dynamic_sampling:
        first = draw(0, len(prompts))
        return _Sampled(first.batch, first.rewards, None, None, {})
    extra_rounds = algo.dynamic_sampling_max_rounds if more_prompts is not None else 0
    found = sample_informative_groups(draw, len(prompts), extra_rounds)
    if not found.kept:  # nothing to learn from: report the first round's outputs, no update
        return _Sampled(rounds[0].batch, rounds[0].rewards, None, ALL_GROUPS_EQUAL, found.stats())
    return _Sampled(found.batch, found.rewards, found.kept, None, found.stats())
