"""A step's parts: grpo.algo picks how groups are sampled and what learns beside the policy,
once (`step_parts`), and `grpo_step` runs them in order: the critic's values before the
advantages, its training after the policy update, on the batch the loss sees."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from grpo_core.algo.advantages import PPOTerms
from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.step import NoCritic, grpo_step, step_parts
from grpo_core.algo.step_rounds import DynamicSampling, OneRound
from grpo_core.contracts.policy_batch import PolicyBatch
from tests.grpo_core.algo.test_rewards import RecordingUpdate, ScriptedSampler, reward_by_text

PPO = GRPOConfig(adv_estimator="ppo")


class RecordingCritic:
    """A critic of zero values whose calls are recorded beside the policy update's."""

    def __init__(self, update: RecordingUpdate) -> None:
        self.policy_update = update
        self.calls: list[tuple[str, PolicyBatch, int]] = []

    def prepare(self, batch: PolicyBatch) -> PPOTerms:
        self.calls.append(("prepare", batch, len(self.policy_update.calls)))
        zeros = torch.zeros(batch.response_mask.shape[0], int(batch.response_lengths.max()))
        return PPOTerms(zeros, zeros, kl_coef=0.0, gamma=1.0, lam=1.0, whiten=False)

    def update(
        self, batch: PolicyBatch, terms: PPOTerms, scores: Tensor, seed: int
    ) -> dict[str, float]:
        self.calls.append(("update", batch, len(self.policy_update.calls)))
        return {"value_loss": 0.5}


def parts(algo: GRPOConfig, update: RecordingUpdate, critic: RecordingCritic | None = None):  # type: ignore[no-untyped-def]
    return step_parts(
        ScriptedSampler(),
        update,
        algo,
        group_size=3,
        max_new_tokens=7,
        pad_token_id=0,
        critic=critic,
    )


def test_the_config_picks_the_sampling_rounds() -> None:
    update = RecordingUpdate()
    assert isinstance(parts(GRPOConfig(), update).rounds, OneRound)
    dapo = GRPOConfig(dynamic_sampling=True, dynamic_sampling_max_rounds=4)
    assert parts(dapo, update).rounds == DynamicSampling(max_extra_rounds=4)


def test_an_estimator_that_reads_values_needs_a_critic() -> None:
    with pytest.raises(ValueError, match="advantage estimator 'ppo' needs a critic"):
        parts(PPO, RecordingUpdate())


def test_a_critic_is_left_out_where_the_estimator_reads_no_values() -> None:
    update = RecordingUpdate()
    assert isinstance(parts(GRPOConfig(), update, RecordingCritic(update)).critic, NoCritic)


def test_the_critic_reads_before_the_policy_update_and_learns_after_it() -> None:
    update = RecordingUpdate()
    critic = RecordingCritic(update)
    out = grpo_step(parts(PPO, update, critic), ["a", "b"], reward_by_text, seed=3)
    assert [(name, updates_before) for name, _, updates_before in critic.calls] == [
        ("prepare", 0),
        ("update", 1),
    ]
    ((trained, _, _, _),) = update.calls
    assert all(batch is trained for _, batch, _ in critic.calls)  # the batch the loss sees
    # GAE of zero values and no KL: each output's reward on every one of its tokens
    first = out.advantages[:, 0]
    assert torch.equal(first, out.rewards.total)
    assert list(out.stats)[:3] == ["kl", "loss", "value_loss"]  # the critic's after the update's
