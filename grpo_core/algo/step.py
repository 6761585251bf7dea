"""One GRPO step (paper Algorithm 1, one pass of its inner loop): sample G outputs per prompt,
reward them, turn rewards into token advantages, update the policy, report metrics.

The GRPO stage (flows/stages/grpo.py) and the step benchmarks (bench/grpo_step.py...) both
call `grpo_step` with the parts every step of theirs shares (`StepParts`: the engines, and
the strategies grpo.algo picks: how groups are sampled, what learns beside the policy); what
differs between steps (prompts, reward, seed) is passed per step. A degenerate batch (no
prompt to draw, no response token to learn from) is a skipped step with its reason in the
metrics, never a NaN or an exception.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import torch
from torch import Tensor

from grpo_core.algo.advantages import PPOTerms
from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.rewards import StepRewards, reward_stats, token_advantages
from grpo_core.algo.step_rounds import (
    ALL_GROUPS_EQUAL,
    GroupRounds,
    MorePrompts,
    RewardFn,
    RoundSampler,
    group_rounds,
    rewards_of_nothing,
)
from grpo_core.contracts.numerics import (
    DIVERGED,
    REWARD_SOURCE,
    require_finite,
    require_finite_metrics,
)
from grpo_core.contracts.policy_batch import PolicyBatch, build_policy_batch
from grpo_core.contracts.rollout import RolloutBatch, Sampler, SamplingParams

# Why a step made no update; stored as metric rows `skipped` = 1 and `skipped_<reason>` = 1.
NO_PROMPTS = "no_prompts"
NO_RESPONSE_TOKENS = "no_response_tokens"
ALL_TRUNCATED = "all_truncated"
NO_PAIRS = "no_pairs"
SKIPPED = "skipped"
SKIP_EXPLAINED = {
    NO_PROMPTS: "the task has no train problem for this step",
    NO_RESPONSE_TOKENS: "every output is empty, so no token has a log-prob to train",
    ALL_TRUNCATED: "every output was cut at max_new_tokens and grpo.algo.mask_truncated "
    "leaves such outputs out of the loss",
    NO_PAIRS: "the DPO pairing found no group with a preferred and a dispreferred output "
    "(dpo: a right and a wrong one; dpo_ranked: two different rewards)",
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


class StepCritic(Protocol):
    """What a step learns beside the policy, around its update: nothing (GRPO), or PPO's
    critic, whose values the advantages read (`read`) and which then trains on the batch."""

    def read(self, batch: PolicyBatch) -> PPOTerms | None:
        """The values and KL terms the advantage estimator reads (None: it reads none)."""
        ...

    def learn(
        self, batch: PolicyBatch, terms: PPOTerms | None, scores: Tensor, seed: int
    ) -> dict[str, float]:
        """Train after the policy update on the same batch; metrics."""
        ...


class NoCritic:
    """GRPO's steps: no value function, nothing learned beside the policy."""

    def read(self, batch: PolicyBatch) -> PPOTerms | None:
        return None

    def learn(
        self, batch: PolicyBatch, terms: PPOTerms | None, scores: Tensor, seed: int
    ) -> dict[str, float]:
        return {}


@dataclass(frozen=True)
class LearnedCritic:
    """PPO's steps: `learner`'s values before the update, its training after it."""

    learner: ValueLearner

    def read(self, batch: PolicyBatch) -> PPOTerms | None:
        return self.learner.prepare(batch)

    def learn(
        self, batch: PolicyBatch, terms: PPOTerms | None, scores: Tensor, seed: int
    ) -> dict[str, float]:
        return {} if terms is None else self.learner.update(batch, terms, scores, seed)


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


@dataclass(frozen=True)
class StepParts:
    """What every step of a stage shares (built once, by the GRPO stage's set-up or a bench):
    the sampler, the policy update, the algorithm and the strategies it picks."""

    sampler: Sampler
    policy: PolicyUpdate
    algo: GRPOConfig
    group_size: int
    max_new_tokens: int
    pad_token_id: int
    rounds: GroupRounds  # one sampling round, or dynamic sampling's (step_rounds.py)
    critic: StepCritic  # PPO's critic, or none

    def round_sampler(self, seed: int, where: str) -> RoundSampler:
        """The sampler of a step's rounds, seeded `seed`."""
        params = SamplingParams(
            max_new_tokens=self.max_new_tokens, temperature=self.algo.temperature
        )
        return RoundSampler(self.sampler, self.group_size, params, seed, where)


def step_parts(
    sampler: Sampler,
    policy: PolicyUpdate,
    algo: GRPOConfig,
    *,
    group_size: int,
    max_new_tokens: int,
    pad_token_id: int,
    critic: ValueLearner | None = None,
) -> StepParts:
    """The parts of algo's steps: its way of sampling groups (group_rounds), and `critic` when
    algo.adv_estimator reads values (PPO), which then trains beside the policy."""
    needs_values = algo.estimator.needs_values
    if needs_values and critic is None:
        raise ValueError(f"advantage estimator {algo.adv_estimator!r} needs a critic")
    learned = LearnedCritic(critic) if needs_values and critic is not None else NoCritic()
    rounds = group_rounds(algo)
    return StepParts(
        sampler, policy, algo, group_size, max_new_tokens, pad_token_id, rounds, learned
    )


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


@dataclass(frozen=True)
class LossRows:
    """The rows and tokens of a step's batch the update learns from: every output padded
    (B, L), and the batch the loss sees, where grpo.algo.mask_truncated masks out outputs cut
    at max_new_tokens (a zero advantage alone would still count them in the normalisers)."""

    padded: PolicyBatch
    trained: PolicyBatch
    response_mask: Tensor  # (B, T) every output's response tokens, response coordinates
    truncated: Tensor  # (B,) bool: the output was cut at max_new_tokens
    lengths: Tensor  # (B,) response tokens of each output
    mask_truncated: bool

    def skip_reason(self, num_prompts: int) -> str | None:
        """skip_reason of the batch, or ALL_TRUNCATED when the mask leaves no token."""
        reason = skip_reason(num_prompts, int(self.response_mask.sum()))
        if reason is None and int(self.trained.response_mask.sum()) == 0:
            return ALL_TRUNCATED
        return reason

    def in_loss(self, advantages: Tensor) -> Tensor:
        """(B, T) advantages, zero on the rows the loss leaves out."""
        if not self.mask_truncated:
            return advantages
        return advantages * (~self.truncated).to(advantages.dtype).reshape(-1, 1)


def loss_rows(batch: RolloutBatch, pad_token_id: int, mask_truncated: bool) -> LossRows:
    """The LossRows of a step's sampled batch."""
    padded = build_policy_batch(batch.prompt_ids, batch.completion_ids, pad_token_id)
    truncated = torch.tensor([r == "length" for r in batch.finish_reasons], dtype=torch.bool)
    trained = padded
    if mask_truncated:
        kept_rows = (~truncated).to(padded.response_mask.dtype).reshape(-1, 1)
        trained = replace(padded, response_mask=padded.response_mask * kept_rows)
    lengths = torch.tensor([len(ids) for ids in batch.completion_ids])
    response_mask = padded.full_to_response(padded.response_mask)
    return LossRows(padded, trained, response_mask, truncated, lengths, mask_truncated)


def grpo_step(
    parts: StepParts,
    prompts: list[str],
    reward: RewardFn,
    *,
    seed: int,
    where: str = "GRPO step",
    more_prompts: MorePrompts | None = None,
) -> StepOutcome:
    """Sample parts.group_size outputs per prompt with `seed` (parts.rounds: one round, or
    dynamic sampling's, with further prompts from `more_prompts`), reward them, compute
    algo.adv_estimator's advantages (with parts.critic's values) and update the policy on
    the rows LossRows leaves in the loss; then parts.critic learns. Every value is checked
    finite (`where` names the step); a batch that cannot update the policy (`skipped` set)
    makes no update and has zero advantages."""
    if not prompts:
        empty = RolloutBatch([], [], [], [], [], [])
        nothing = rewards_of_nothing()
        return StepOutcome(empty, nothing, torch.zeros(0, 0), skip_stats(NO_PROMPTS), NO_PROMPTS)
    algo = parts.algo
    sampled = parts.rounds.sample(parts.round_sampler(seed, where), prompts, reward, more_prompts)
    batch, rewards, kept = sampled.batch, sampled.rewards, sampled.kept
    rows = loss_rows(batch, parts.pad_token_id, algo.mask_truncated)
    extra = {**sampled.stats, **length_stats(rows.lengths, rewards.verifier, rows.truncated)}
    skipped = sampled.skipped or rows.skip_reason(sampled.num_prompts)
    if skipped is not None:
        stats = {**skip_stats(skipped), **reward_stats(rewards, parts.group_size), **extra}
        require_finite_metrics(stats, where=where, cause=REWARD_SOURCE)
        no_advantages = torch.zeros(rows.response_mask.shape)
        return StepOutcome(batch, rewards, no_advantages, stats, skipped, kept)
    terms = parts.critic.read(rows.trained)
    shape = (sampled.num_prompts, parts.group_size)
    advantages = token_advantages(algo, rewards, rows.response_mask, shape, terms)
    require_finite("advantages", advantages, where=where, cause=REWARD_SOURCE)
    advantages = rows.in_loss(advantages)
    if algo.estimator.pairs and not bool(advantages.any()):  # DPO with nothing to prefer
        stats = {**skip_stats(NO_PAIRS), "dpo_pairs": 0.0}
        stats.update({**reward_stats(rewards, parts.group_size), **extra})
        require_finite_metrics(stats, where=where, cause=REWARD_SOURCE)
        return StepOutcome(batch, rewards, advantages, stats, NO_PAIRS, kept)
    old = rows.padded.lists_to_full(batch.logprobs) if algo.reads_sampling_logprobs else None
    trained = rows.trained
    stats = parts.policy.update(trained, trained.response_to_full(advantages), old, seed)
    stats.update(parts.critic.learn(trained, terms, rewards.total, seed))
    stats.update(reward_stats(rewards, parts.group_size))
    stats.update(extra)
    require_finite_metrics(stats, where=where, cause=DIVERGED)
    return StepOutcome(batch, rewards, advantages, stats, None, kept)
