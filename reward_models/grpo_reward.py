"""The reward of a GRPO step's outputs: every reward part of reward_models/parts/ that has a
weight (and those scored always), weighted by `grpo.rewards`; the combination rules are in
grpo_core/algo/rewards.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from grpo_core.algo.rewards import ScoredPart, StepRewards, outcome_reward, process_rewards
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
    """Scores a step's outputs; `process_supervision` adds the PRM's per-step rewards.

    Step boundaries under process supervision come from the policy's own sampled tokens
    (`policy_tokenizer`); the PRM reads each step in its own tokenization of the same text.
    """

    task: Task
    weights: RewardWeightsBase
    policy_tokenizer: PreTrainedTokenizerBase
    max_new_tokens: int
    models: Mapping[RMKind, RewardModel] = field(default_factory=dict)
    process_supervision: bool = False

    def __post_init__(self) -> None:
        missing = models_needed(self.weights, self.process_supervision) - set(self.models)
        if missing:
            raise ValueError(f"the reward parts and estimator need {sorted(missing)}: give them")

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
        )
        parts: dict[str, Tensor] = {}
        scored: list[ScoredPart] = []
        for part in scored_parts(self.weights):
            values = part.score(context, self.weights.options(part.name))
            parts[part.name] = torch.as_tensor(values, dtype=torch.float32)
            weight = self.weights.weight(part.name)
            scored.append(ScoredPart(weight, parts[part.name], part.learned))
        total, rm = outcome_reward(scored)
        if not self.process_supervision:
            return StepRewards(total, parts, rm)
        ends = [step_end_token_indices(ids, self.policy_tokenizer) for ids in batch.completion_ids]
        return process_rewards(context.step_scores(), ends, total, parts)
