"""The reward of a GRPO step's outputs: every reward part of reward_models/parts/ that has a
weight (and those scored always), weighted by `grpo.rewards`; the combination rules are in
grpo_core/algo/rewards.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from grpo_core.algo.rewards import (
    ScoredPart,
    StepRewards,
    outcome_reward,
    process_rewards,
    token_rewards,
)
from grpo_core.contracts.rollout import RolloutBatch
from grpo_core.data.reasoning_steps import step_end_token_indices
from grpo_core.data.tasks.base import Problem, Task
from reward_models.config import RMKind
from reward_models.models import RewardModel
from reward_models.parts import REWARD_PARTS, RewardPart, RewardWeightsBase, ScoringContext


def scored_parts(weights: RewardWeightsBase) -> list[RewardPart]:
    """The parts a step scores, in summing order: those with a weight, and those scored always."""
    return [p for name, p in REWARD_PARTS.items() if p.always or weights.weight(name) > 0]


def models_needed(weights: RewardWeightsBase, step_rewards: bool) -> set[RMKind]:
    """The reward models the scored parts read, and the PRM when the estimator reads step
    rewards (process supervision)."""
    needed = {need for part in scored_parts(weights) for need in part.needs}
    return needed | ({"prm"} if step_rewards else set())


@dataclass
class GRPORewarder:
    """Scores a step's outputs; `process_supervision` adds the PRM's per-step rewards, and the
    per-token parts scored give the token rewards.

    Step boundaries under process supervision come from the policy's own sampled tokens
    (`policy_tokenizer`); the PRM reads each step in its own tokenization of the same text.
    `temperature`: the outputs' sampling temperature; `device`: where the models the scored
    parts load (a teacher) run.
    """

    task: Task
    weights: RewardWeightsBase
    policy_tokenizer: PreTrainedTokenizerBase
    max_new_tokens: int
    models: Mapping[RMKind, RewardModel] = field(default_factory=dict)
    process_supervision: bool = False
    temperature: float = 1.0
    device: str = "cpu"
    loaded: dict[str, Any] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        missing = models_needed(self.weights, self.process_supervision) - set(self.models)
        if missing:
            raise ValueError(f"the reward parts and estimator need {sorted(missing)}: give them")
        self.loaded = {
            part.name: part.load(self.weights.options(part.name), self.device)
            for part in scored_parts(self.weights)
            if part.load is not None
        }

    def __call__(
        self, problems: list[Problem], prompts: list[str], batch: RolloutBatch
    ) -> StepRewards:
        context = ScoringContext(
            task=self.task,
            problems=[problems[i] for i in batch.prompt_index],
            prompts=[prompts[i] for i in batch.prompt_index],
            batch=batch,
            max_new_tokens=self.max_new_tokens,
            models=self.models,
            temperature=self.temperature,
            loaded=self.loaded,
        )
        parts: dict[str, Tensor] = {}
        scored: list[ScoredPart] = []
        per_token: list[tuple[float, Sequence[Sequence[float]]]] = []
        for part in scored_parts(self.weights):
            options, weight = self.weights.options(part.name), self.weights.weight(part.name)
            if part.token_score is not None:
                tokens = _checked_token_scores(part.name, part.token_score(context, options), batch)
                per_token.append((weight, tokens))
                values: Tensor | Sequence[float] = [sum(row) for row in tokens]
            else:
                assert part.score is not None  # RewardPart has one of the two
                values = part.score(context, options)
            parts[part.name] = torch.as_tensor(values, dtype=torch.float32)
            scored.append(ScoredPart(weight, parts[part.name], part.learned))
        total, rm = outcome_reward(scored)
        if not self.process_supervision:
            return StepRewards(total, parts, rm, token_rewards=token_rewards(per_token))
        ends = [step_end_token_indices(ids, self.policy_tokenizer) for ids in batch.completion_ids]
        rewards = process_rewards(context.step_scores(), ends, total, parts)
        return replace(rewards, token_rewards=token_rewards(per_token))


def _checked_token_scores(
    name: str, scores: Sequence[Sequence[float]], batch: RolloutBatch
) -> list[list[float]]:
    """A per-token part's scores as floats, one per response token of each output."""
    lengths = [len(ids) for ids in batch.completion_ids]
    if [len(row) for row in scores] != lengths:
        raise ValueError(
            f"reward part {name!r} gave {[len(row) for row in scores]} token scores for outputs "
            f"of {lengths} tokens: one per response token"
        )
    return [[float(v) for v in row] for row in scores]
