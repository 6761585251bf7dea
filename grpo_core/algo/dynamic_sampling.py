"""Dynamic sampling (DAPO, Yu et al. 2025): a group whose outputs all got the same reward has
zero advantage everywhere, so it spends a slot of the batch on no outcome gradient. Such groups
are dropped and further prompts sampled until the step has as many groups as it asked for, or
the cap on extra rounds is reached.

Pure apart from the `draw` callback that samples and rewards one round: which prompts a round
gets, with which seed, is the caller's (the GRPO stage draws them from its prompt cursor, so
the same config and seed give the same rounds and a resumed run continues where it stopped).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from grpo_core.algo.estimators import VERIFIER
from grpo_core.algo.rewards import StepRewards
from grpo_core.contracts.rollout import RolloutBatch

# Rewards within this distance of each other count as equal (as equal_reward_groups counts).
EQUAL_REWARD_TOL = 1e-6


@dataclass
class SampledRound:
    """One round's prompts (P of them), their P x G outputs and the outputs' rewards."""

    num_prompts: int
    batch: RolloutBatch
    rewards: StepRewards


# draw(round, count) samples and rewards `count` new prompts (fewer when the pool has fewer).
DrawRound = Callable[[int, int], SampledRound]


@dataclass
class DynamicSample:
    """The groups a step keeps, and what it took to find them."""

    batch: RolloutBatch  # the kept groups' outputs; prompt_index counts kept groups 0..K-1
    rewards: StepRewards  # their rewards, rows as in `batch`
    kept: list[int]  # position of each kept group among all prompts drawn this step, in order
    prompts_drawn: int
    groups_dropped: int
    rounds: int  # rounds that sampled, the first included
    filled: bool  # as many groups kept as the first round had prompts

    def stats(self) -> dict[str, float]:
        """The step's dynamic-sampling metrics."""
        return {
            "prompts_drawn": float(self.prompts_drawn),
            "groups_dropped": float(self.groups_dropped),
            "sampling_rounds": float(self.rounds),
            "batch_filled": float(self.filled),
        }


def round_seed(seed: int, round_index: int) -> int:
    """The sampling seed of round `round_index` of a step seeded `seed`: the step's own seed
    for the first round (a step without extra rounds samples as it always did), a stable
    31-bit mix of the two after it."""
    if round_index == 0:
        return seed
    digest = hashlib.sha256(repr(("dynamic_sampling", seed, round_index)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def informative_groups(rewards: Tensor, prompt_index: list[int], num_prompts: int) -> list[int]:
    """The prompts (0..num_prompts-1) whose outputs' rewards are not all equal; rewards (B,)
    with row r an output of prompt prompt_index[r]. A group of one output is never informative
    (its advantage is 0)."""
    index = torch.as_tensor(prompt_index, dtype=torch.long)
    kept = []
    for p in range(num_prompts):
        group = rewards[index == p]
        if group.numel() > 1 and float(group.max() - group.min()) > EQUAL_REWARD_TOL:
            kept.append(p)
    return kept


def sample_informative_groups(draw: DrawRound, target: int, max_extra_rounds: int) -> DynamicSample:
    """Draw rounds until `target` informative groups are kept or `max_extra_rounds` rounds
    after the first were used. Round 0 draws `target` prompts, each later round as many as
    groups are still missing (so no kept group is thrown away for lack of room); a round that
    draws no prompt (an empty pool) ends the search."""
    rounds: list[tuple[int, SampledRound, list[int]]] = []  # (offset, round, kept groups)
    drawn, missing, used = 0, target, 0
    while missing > 0 and used <= max_extra_rounds:
        sampled = draw(used, missing)
        if sampled.num_prompts == 0:  # the source has no prompt left: not a round
            break
        used += 1
        keep = informative_groups(
            sampled.rewards.per_output, sampled.batch.prompt_index, sampled.num_prompts
        )[:missing]
        rounds.append((drawn, sampled, keep))
        drawn += sampled.num_prompts
        missing -= len(keep)
    kept = [offset + p for offset, _, keep in rounds for p in keep]
    batch, rewards = _concat_groups([(s, keep) for _, s, keep in rounds])
    return DynamicSample(
        batch=batch,
        rewards=rewards,
        kept=kept,
        prompts_drawn=drawn,
        groups_dropped=drawn - len(kept),
        rounds=used,
        filled=len(kept) >= target,
    )


def _concat_groups(parts: list[tuple[SampledRound, list[int]]]) -> tuple[RolloutBatch, StepRewards]:
    """The rows of the kept groups of each round, prompt-major, renumbered 0..K-1."""
    rows: list[tuple[SampledRound, int, int]] = []  # (round, row in it, new prompt index)
    new_index = 0
    for sampled, keep in parts:
        for p in keep:
            rows += [
                (sampled, r, new_index) for r, i in enumerate(sampled.batch.prompt_index) if i == p
            ]
            new_index += 1
    batch = RolloutBatch(
        prompt_index=[q for _, _, q in rows],
        prompt_ids=[s.batch.prompt_ids[r] for s, r, _ in rows],
        completion_ids=[s.batch.completion_ids[r] for s, r, _ in rows],
        texts=[s.batch.texts[r] for s, r, _ in rows],
        finish_reasons=[s.batch.finish_reasons[r] for s, r, _ in rows],
        logprobs=[s.batch.logprobs[r] for s, r, _ in rows],
    )
    names = list(parts[0][0].rewards.parts) if parts else [VERIFIER]
    if not rows:  # nothing kept: empty tensors under the part names the rounds had
        empty = torch.zeros(0)
        return batch, StepRewards(empty, {n: empty.clone() for n in names}, None)
    first = rows[0][0].rewards
    index = [r for _, r, _ in rows]

    def pick(values: list[Tensor]) -> Tensor:
        return torch.stack([v[r] for v, r in zip(values, index, strict=True)])

    def per_row(get: Callable[[StepRewards], Tensor | None]) -> list[Tensor]:
        return [get(s.rewards) for s, _, _ in rows]  # type: ignore[misc]

    steps = first.step_scores is not None and first.step_ends is not None
    rewards = StepRewards(
        total=pick(per_row(lambda w: w.total)),
        parts={n: pick(per_row(lambda w, n=n: w.parts[n])) for n in names},  # type: ignore[misc]
        rm=None if first.rm is None else pick(per_row(lambda w: w.rm)),
        step_scores=[s.rewards.step_scores[r] for s, r, _ in rows] if steps else None,  # type: ignore[index]
        step_ends=[s.rewards.step_ends[r] for s, r, _ in rows] if steps else None,  # type: ignore[index]
        token_rewards=None
        if first.token_rewards is None
        else [s.rewards.token_rewards[r] for s, r, _ in rows],  # type: ignore[index]
    )
    return batch, rewards
