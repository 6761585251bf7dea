"""The reward of a GRPO step's outputs: the verifier and the format rule, the learned reward
models' scores, weighted by `grpo.rewards` (the combination rules: grpo_core/algo/rewards.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from grpo_core.algo.rewards import StepRewards, WeightedPart, outcome_reward, process_rewards
from grpo_core.contracts.rollout import RolloutBatch
from grpo_core.data.answers import format_reward
from grpo_core.data.reasoning_steps import step_end_token_indices
from grpo_core.data.tasks.base import Problem, Task
from reward_models.config import RewardWeights
from reward_models.models import RewardModel
from reward_models.scoring import aggregate_step_scores, score_outcome, score_steps


@dataclass
class GRPORewarder:
    """Scores a step's outputs; `process_supervision` adds the PRM's per-step rewards.

    Step boundaries under process supervision come from the policy's own sampled tokens
    (`policy_tokenizer`); the PRM reads each step in its own tokenization of the same text.
    """

    task: Task
    weights: RewardWeights
    policy_tokenizer: PreTrainedTokenizerBase
    orm: RewardModel | None = None
    prm: RewardModel | None = None
    process_supervision: bool = False

    def __post_init__(self) -> None:
        if self.process_supervision and self.prm is None:
            raise ValueError("process supervision rewards each step with a PRM: give one")

    def __call__(
        self, problems: list[Problem], prompts: list[str], batch: RolloutBatch
    ) -> StepRewards:
        owners = [problems[i] for i in batch.prompt_index]
        row_prompts = [prompts[i] for i in batch.prompt_index]
        verifier = torch.tensor(
            [float(self.task.is_correct(p, t)) for p, t in zip(owners, batch.texts, strict=True)]
        )
        fmt = torch.tensor([format_reward(t) for t in batch.texts])
        fixed: list[WeightedPart] = [(self.weights.verifier, verifier), (self.weights.format, fmt)]
        learned: list[WeightedPart] = []
        if self.orm is not None and self.weights.orm > 0:
            scores = score_outcome(self.orm, self.orm.tokenizer, row_prompts, batch.texts)
            learned.append((self.weights.orm, scores.float().cpu()))
        steps = None
        if self.prm is not None and (self.weights.prm > 0 or self.process_supervision):
            steps = score_steps(self.prm, self.prm.tokenizer, row_prompts, batch.texts).scores
        if steps is not None and self.weights.prm > 0:
            folded = aggregate_step_scores(steps, self.weights.prm_aggregation)
            learned.append((self.weights.prm, folded))
        total, rm = outcome_reward(fixed, learned)
        if not self.process_supervision:
            return StepRewards(total, verifier, fmt, rm)
        assert steps is not None  # __post_init__: a PRM is given
        ends = [step_end_token_indices(ids, self.policy_tokenizer) for ids in batch.completion_ids]
        return process_rewards(steps, ends, total, verifier, fmt)
