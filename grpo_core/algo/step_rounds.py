"""How a GRPO step gets its groups: one sampling round of its prompts (the paper), or dynamic
sampling's rounds (DAPO, dynamic_sampling.py) that replace groups of equal rewards with
further prompts until the batch is full. `group_rounds` picks one from grpo.algo, once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.dynamic_sampling import SampledRound, round_seed, sample_informative_groups
from grpo_core.algo.estimators import VERIFIER
from grpo_core.algo.rewards import StepRewards, check_rewards
from grpo_core.contracts.numerics import DIVERGED, require_finite
from grpo_core.contracts.rollout import RolloutBatch, Sampler, SamplingParams

RewardFn = Callable[[RolloutBatch], StepRewards]
# more_prompts(round, count): up to `count` further prompts for extra sampling round `round`
# (dynamic sampling) and their reward function; no prompt when the source has none left.
MorePrompts = Callable[[int, int], tuple[list[str], RewardFn]]

# Why a step under dynamic sampling makes no update (a skip reason, see step.py)
ALL_GROUPS_EQUAL = "all_groups_equal"


def rewards_of_nothing() -> StepRewards:
    """The rewards of an empty batch."""
    return StepRewards(torch.zeros(0), {VERIFIER: torch.zeros(0)}, None)


@dataclass(frozen=True)
class RoundSampler:
    """One sampling round of a step seeded `seed`: G outputs per prompt, their sampling
    log-probs checked finite, then rewarded and the rewards checked (`where` names the step)."""

    sampler: Sampler
    group_size: int
    params: SamplingParams
    seed: int
    where: str

    def __call__(self, round_index: int, prompts: list[str], reward: RewardFn) -> SampledRound:
        if not prompts:
            return SampledRound(0, RolloutBatch([], [], [], [], [], []), rewards_of_nothing())
        seed = round_seed(self.seed, round_index)
        batch = self.sampler.generate(prompts, self.group_size, self.params, seed=seed)
        sampled = [lp for row in batch.logprobs for lp in row]
        require_finite("the policy's sampling log-probs", sampled, where=self.where, cause=DIVERGED)
        rewards = reward(batch)
        check_rewards(rewards, self.where)
        return SampledRound(len(prompts), batch, rewards)


@dataclass(frozen=True)
class SampledGroups:
    """A step's groups, sampled and rewarded: the ones it learns from."""

    batch: RolloutBatch
    rewards: StepRewards
    num_prompts: int  # groups in `batch`
    # the position of each group among all prompts the step drew (StepOutcome.kept_prompts);
    # None: the step's own prompts, in order
    kept: list[int] | None = None
    skipped: str | None = None  # a reason to make no update, found while sampling
    stats: dict[str, float] = field(default_factory=dict)


class GroupRounds(Protocol):
    """How a step samples its groups: `draw` samples one round, `more_prompts` (None: there
    are none) gives the prompts of rounds after the first."""

    def sample(
        self,
        draw: RoundSampler,
        prompts: list[str],
        reward: RewardFn,
        more_prompts: MorePrompts | None,
    ) -> SampledGroups: ...


class OneRound:
    """The paper's step: one round of the step's prompts, every group kept."""

    def sample(
        self,
        draw: RoundSampler,
        prompts: list[str],
        reward: RewardFn,
        more_prompts: MorePrompts | None,
    ) -> SampledGroups:
        first = draw(0, prompts, reward)
        return SampledGroups(first.batch, first.rewards, len(prompts))


@dataclass(frozen=True)
class DynamicSampling:
    """DAPO's dynamic sampling: groups of equal rewards dropped, and up to `max_extra_rounds`
    further rounds from `more_prompts` until the step has as many groups as prompts."""

    max_extra_rounds: int

    def sample(
        self,
        draw: RoundSampler,
        prompts: list[str],
        reward: RewardFn,
        more_prompts: MorePrompts | None,
    ) -> SampledGroups:
        rounds: list[SampledRound] = []

        def draw_round(round_index: int, count: int) -> SampledRound:
            if round_index == 0:
                sampled = draw(0, prompts, reward)
            else:
                assert more_prompts is not None  # else extra_rounds is 0
                sampled = draw(round_index, *more_prompts(round_index, count))
            if sampled.num_prompts:
                rounds.append(sampled)
            return sampled

        extra_rounds = self.max_extra_rounds if more_prompts is not None else 0
        found = sample_informative_groups(draw_round, len(prompts), extra_rounds)
        if not found.kept:  # nothing to learn from: report the first round's outputs
            first = rounds[0]
            return SampledGroups(
                first.batch, first.rewards, len(prompts), None, ALL_GROUPS_EQUAL, found.stats()
            )
        return SampledGroups(
            found.batch, found.rewards, len(found.kept), found.kept, None, found.stats()
        )


def group_rounds(algo: GRPOConfig) -> GroupRounds:
    """grpo.algo's way of sampling a step's groups: dynamic sampling, or one round."""
    if algo.dynamic_sampling:
        return DynamicSampling(algo.dynamic_sampling_max_rounds)
    return OneRound()
