"""Reward rules of a GRPO step (grpo_core/algo/rewards.py) and the step itself
(grpo_core/algo/step.py), on hand-computed values and a scripted sampler and updater."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.estimators import VERIFIER
from grpo_core.algo.rewards import (
    ScoredPart,
    StepRewards,
    outcome_reward,
    process_rewards,
    reward_stats,
    token_advantages,
)
from grpo_core.algo.step import grpo_step, step_parts
from grpo_core.contracts.numerics import NonFiniteError
from grpo_core.contracts.policy_batch import PolicyBatch
from grpo_core.contracts.rollout import RolloutBatch, SamplingParams


def test_outcome_reward_weights_every_part_and_averages_the_learned_ones() -> None:
    verifier, fmt = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([1.0, 1.0, 0.0])
    orm, prm = torch.tensor([0.9, 0.2, 0.4]), torch.tensor([0.5, 0.1, 0.7])
    total, rm = outcome_reward(
        [
            ScoredPart(1.0, verifier),
            ScoredPart(0.5, fmt),
            ScoredPart(2.0, orm, learned=True),
            ScoredPart(1.0, prm, learned=True),
        ]
    )
    assert torch.allclose(
        total, torch.tensor([1 + 0.5 + 1.8 + 0.5, 0.5 + 0.4 + 0.1, 1 + 0.8 + 0.7])
    )
    assert rm is not None
    assert torch.allclose(rm, torch.tensor([(1.8 + 0.5) / 3, (0.4 + 0.1) / 3, (0.8 + 0.7) / 3]))


def test_outcome_reward_without_learned_parts_has_no_rm_reward() -> None:
    total, rm = outcome_reward([ScoredPart(1.0, torch.tensor([1.0, 0.0]))])
    assert rm is None and torch.equal(total, torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="at least one"):
        outcome_reward([])


def test_process_rewards_add_the_outcome_to_the_last_step_only() -> None:
    steps = [[0.2, 0.6, 0.9], [0.5], []]
    ends = [[3, 7, 10], [4], []]
    outcome = torch.tensor([1.0, 0.0, 0.5])
    verifier = torch.tensor([1.0, 0.0, 0.0])
    rewards = process_rewards(steps, ends, outcome, {VERIFIER: verifier, "format": torch.zeros(3)})
    assert rewards.step_scores == [[0.2, 0.6, 1.9], [0.5], []]
    assert rewards.step_ends == ends
    assert rewards.rm is not None
    assert torch.allclose(rewards.rm, torch.tensor([(0.2 + 0.6 + 0.9) / 3, 0.5, 0.0]))
    # per output: the outcome reward plus the mean step score (without the outcome part)
    assert torch.allclose(rewards.per_output, outcome + rewards.rm)


def test_process_rewards_refuse_steps_the_policy_tokens_do_not_have() -> None:
    with pytest.raises(
        ValueError, match="output 1: the PRM found 2 steps but the policy's tokens 1"
    ):
        process_rewards([[0.1], [0.2, 0.3]], [[2], [5]], torch.zeros(2), {VERIFIER: torch.zeros(2)})


def test_outcome_supervision_rewards_each_output_its_total() -> None:
    total = torch.tensor([1.0, 2.0])
    rewards = StepRewards(total, {VERIFIER: torch.ones(2)}, rm=torch.tensor([0.3, 0.4]))
    assert rewards.per_output is total


def test_reward_stats_count_groups_without_an_outcome_gradient() -> None:
    total = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0])  # group 0 equal, group 1 not
    verifier = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    stats = reward_stats(StepRewards(total, {VERIFIER: verifier}, None), group_size=3)
    assert stats == {
        "reward_mean": pytest.approx(4 / 6),
        "verifier_accuracy": pytest.approx(0.5),
        "equal_reward_groups": 0.5,
    }  # no rm_reward_mean: no learned reward model was used
    with_rm = StepRewards(total, {VERIFIER: verifier}, torch.full((6,), 0.25))
    assert reward_stats(with_rm, group_size=3)["rm_reward_mean"] == pytest.approx(0.25)


def test_outcome_token_advantages_are_the_group_z_score_on_response_tokens_only() -> None:
    rewards = StepRewards(torch.tensor([1.0, 0.0, 0.0, 1.0]), {VERIFIER: torch.zeros(4)}, None)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.float32)
    adv = token_advantages(GRPOConfig(), rewards, mask, (2, 2))
    a = 0.5 / (0.5 + 1e-4)  # (r - mean) / (population std + eps)
    want = torch.tensor([[a, a, 0.0], [-a, 0.0, 0.0], [-a, -a, -a], [0.0, 0.0, 0.0]])
    assert torch.allclose(adv, want)
    dr = token_advantages(GRPOConfig(adv_estimator="dr_grpo"), rewards, mask, (2, 2))
    assert torch.allclose(dr, want / a * 0.5)  # reward minus group mean, no std division


def test_process_token_advantages_follow_the_step_ends() -> None:
    rewards = process_rewards(
        [[1.0, 0.0], [0.0, 0.0]], [[1, 3], [0, 2]], torch.zeros(2), {VERIFIER: torch.zeros(2)}
    )
    mask = torch.ones(2, 4)
    adv = token_advantages(GRPOConfig(adv_estimator="grpo_process"), rewards, mask, (1, 2))
    # step rewards 1, 0, 0, 0 z-score to (r - 0.25) / (sqrt(3) / 4 + eps)
    hi, lo = 0.75 / (math.sqrt(3) / 4 + 1e-4), -0.25 / (math.sqrt(3) / 4 + 1e-4)
    want = torch.tensor([[hi + lo, hi + lo, lo, lo], [2 * lo, lo, lo, 0.0]])
    assert torch.allclose(adv, want, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(-5, 5, allow_nan=False), min_size=4, max_size=4), min_size=1, max_size=4
    )
)
def test_outcome_advantages_of_each_group_sum_to_zero(groups: list[list[float]]) -> None:
    total = torch.tensor(groups).reshape(-1)
    rewards = StepRewards(total, {VERIFIER: torch.zeros_like(total)}, None)
    adv = token_advantages(GRPOConfig(), rewards, torch.ones(len(total), 1), (len(groups), 4))
    assert torch.allclose(adv.reshape(len(groups), 4).sum(-1), torch.zeros(len(groups)), atol=1e-3)


# ---- grpo_step on a scripted sampler and updater ------------------------------------------


class ScriptedSampler:
    def __init__(self, logprob: float = -0.5) -> None:
        self.logprob = logprob
        self.calls: list[tuple[list[str], int, SamplingParams, int]] = []

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        self.calls.append((prompts, n, params, seed))
        completions = [[5 + r] * (1 + r % 3) for r in range(len(prompts) * n)]
        return RolloutBatch(
            prompt_index=[r // n for r in range(len(prompts) * n)],
            prompt_ids=[[1, 2] for _ in completions],
            completion_ids=completions,
            texts=[str(r) for r in range(len(completions))],
            finish_reasons=["stop"] * len(completions),
            logprobs=[[self.logprob] * len(c) for c in completions],
        )


class RecordingUpdate:
    def __init__(self) -> None:
        self.calls: list[tuple[PolicyBatch, Tensor, Tensor | None, int]] = []

    def update(
        self, batch: PolicyBatch, advantages: Tensor, old_logprobs: Tensor | None, seed: int
    ) -> dict[str, float]:
        self.calls.append((batch, advantages, old_logprobs, seed))
        return {"kl": 0.0, "loss": 1.0}


def reward_by_text(batch: RolloutBatch) -> StepRewards:
    total = torch.tensor([float(int(t) % 2) for t in batch.texts])  # odd outputs correct
    return StepRewards(total, {VERIFIER: total.clone()}, None)


def run_step(
    algo: GRPOConfig, sampler: ScriptedSampler, update: RecordingUpdate, reward=reward_by_text
):  # type: ignore[no-untyped-def]
    parts = step_parts(sampler, update, algo, group_size=3, max_new_tokens=7, pad_token_id=0)
    return grpo_step(parts, ["a", "b"], reward, seed=1234, where="test step")


def test_grpo_step_updates_on_advantages_at_the_completion_columns() -> None:
    sampler, update = ScriptedSampler(), RecordingUpdate()
    out = run_step(GRPOConfig(temperature=0.7), sampler, update)
    assert sampler.calls == [
        (["a", "b"], 3, SamplingParams(max_new_tokens=7, temperature=0.7), 1234)
    ]
    ((batch, advantages, old, seed),) = update.calls
    assert seed == 1234 and old is None
    assert torch.equal(advantages, batch.response_to_full(out.advantages))
    assert torch.all(advantages[batch.response_mask == 0] == 0)  # prompt and padding: none
    # group [0, 1, 0] and [1, 0, 1]: the odd outputs get the positive advantage
    first = out.advantages[:, 0]
    assert (first > 0).tolist() == [False, True, False, True, False, True]
    assert out.stats["verifier_accuracy"] == pytest.approx(0.5) and out.stats["loss"] == 1.0


def test_grpo_step_hands_the_sampling_logprobs_over_as_pi_old_when_asked() -> None:
    update = RecordingUpdate()
    run_step(GRPOConfig(use_sampling_logprobs_as_old=True), ScriptedSampler(), update)
    ((batch, _, old, _),) = update.calls
    assert old is not None
    assert torch.equal(old, torch.where(batch.response_mask > 0, -0.5, 0.0))


def test_grpo_step_stops_at_the_first_non_finite_value_before_the_update() -> None:
    update = RecordingUpdate()
    nan_logprobs = r"sampling log-probs is nan \(12 non-finite value\(s\), first at index 0\)"
    with pytest.raises(NonFiniteError, match=nan_logprobs + " at test step"):
        run_step(GRPOConfig(), ScriptedSampler(logprob=math.nan), update)

    def nan_reward(batch: RolloutBatch) -> StepRewards:
        rewards = reward_by_text(batch)
        rewards.total[4] = math.inf
        return rewards

    inf_reward = r"the weighted reward is inf \(1 non-finite value\(s\), first at index 4\)"
    with pytest.raises(NonFiniteError, match=inf_reward + " at test step"):
        run_step(GRPOConfig(), ScriptedSampler(), update, nan_reward)
    assert update.calls == []
