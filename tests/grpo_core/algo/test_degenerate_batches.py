"""Degenerate GRPO batches are well-defined steps: no prompt, a group of one, all advantages
zero, every output truncated or empty give zeros or a skipped step, never a NaN or an error."""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from grpo_core.algo.advantages import (
    AdvantageInputs,
    PPOTerms,
    outcome_advantages,
    process_advantages,
    zero_advantage_group_fraction,
)
from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.estimators import ADVANTAGE_ESTIMATORS, VERIFIER
from grpo_core.algo.rewards import StepRewards
from grpo_core.algo.step import (
    NO_PROMPTS,
    NO_RESPONSE_TOKENS,
    RewardFn,
    StepOutcome,
    grpo_step,
    skip_reason,
    step_parts,
    step_prompt_indices,
)
from grpo_core.algo.update import grpo_update
from grpo_core.contracts.policy_batch import build_policy_batch
from grpo_core.contracts.rollout import RolloutBatch, SamplingParams
from grpo_core.contracts.training import OptimizerSettings
from grpo_core.engines.train import TorchEngine
from tests.grpo_core.algo.test_rewards import RecordingUpdate, ScriptedSampler, reward_by_text
from tests.models import tiny_llama


@pytest.fixture(autouse=True)
def warnings_are_errors() -> Iterator[None]:
    """A degenerate batch must not warn either (torch's std of nothing does)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# ---- the formulas -------------------------------------------------------------------------


@pytest.mark.parametrize("scaling", ["group_std", "none"])
def test_no_group_gives_no_advantage_and_no_warning(scaling: str) -> None:
    out = outcome_advantages(torch.zeros(0, 4), scaling)  # type: ignore[arg-type]
    assert out.shape == (0, 4)
    assert zero_advantage_group_fraction(torch.zeros(0, 4)) == 0.0


@pytest.mark.parametrize("scaling", ["group_std", "none"])
def test_a_group_of_one_has_zero_advantage(scaling: str) -> None:
    # one output has no one to be compared with: r - mean(r) = 0, and 0 / (0 + eps) = 0
    out = outcome_advantages(torch.tensor([[3.0], [-1.5]]), scaling)  # type: ignore[arg-type]
    assert out.tolist() == [[0.0], [0.0]]
    steps = torch.tensor([[[0.9, 0.2]], [[0.4, 0.0]]])  # (P=2, G=1, S=2)
    mask = torch.tensor([[[True, True]], [[True, False]]])
    ends = torch.tensor([[[0, 1]], [[1, 0]]])
    proc = process_advantages(steps, mask, ends, torch.ones(2, 1, 3))
    # z-scored within each one-output group: [0.9, 0.2] -> [+1, -1] / (0.35 + eps) * 0.35
    z = 0.35 / (0.35 + 1e-4)
    assert proc[0, 0].tolist() == pytest.approx([0.0, -z, 0.0], abs=1e-6)
    assert proc[1].tolist() == [[0.0, 0.0, 0.0]]  # one step: nothing to compare with


def test_outputs_without_steps_or_tokens_get_zero_process_advantage() -> None:
    steps = torch.zeros(1, 3, 1)
    proc = process_advantages(steps, torch.zeros(1, 3, 1, dtype=torch.bool), steps.long(), steps)
    assert proc.tolist() == [[[0.0], [0.0], [0.0]]]


@pytest.mark.parametrize("name", ADVANTAGE_ESTIMATORS.names())
def test_every_estimator_gives_zeros_when_no_output_has_a_token(name: str) -> None:
    """Every output empty: (B, 0) response tokens; no estimator may divide by the count."""
    inputs = AdvantageInputs(
        response_mask=torch.zeros(4, 0),
        rewards=torch.tensor([[1.0, 0.0], [0.0, 0.0]]),
        correct=torch.tensor([[1.0, 0.0], [0.0, 0.0]]),
        step_rewards=torch.zeros(2, 2, 1),
        step_mask=torch.zeros(2, 2, 1, dtype=torch.bool),
        step_ends=torch.zeros(2, 2, 1, dtype=torch.long),
        ppo=PPOTerms(torch.zeros(4, 0), torch.zeros(4, 0), 0.04, 1.0, 0.95, whiten=True),
        token_rewards=torch.zeros(4, 0),
    )
    out = ADVANTAGE_ESTIMATORS[name].fn(inputs, 1e-4)
    assert out.shape == (4, 0)


def test_a_full_pool_gives_each_step_its_own_slice() -> None:
    # the usual case (pool = steps x per_step): unchanged by the wrap-round
    assert [step_prompt_indices(12, s, 4) for s in range(3)] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9, 10, 11],
    ]


def test_a_small_pool_wraps_round_and_a_tiny_one_gives_fewer_prompts() -> None:
    assert [step_prompt_indices(5, s, 4) for s in range(3)] == [
        [0, 1, 2, 3],
        [4, 0, 1, 2],
        [3, 4, 0, 1],
    ]
    assert step_prompt_indices(2, 7, 4) == [0, 1]
    assert step_prompt_indices(0, 0, 4) == []


@given(st.integers(0, 30), st.integers(0, 50), st.integers(1, 12))
def test_step_prompts_are_distinct_and_as_many_as_the_pool_allows(
    pool: int, step: int, per_step: int
) -> None:
    got = step_prompt_indices(pool, step, per_step)
    assert len(got) == len(set(got)) == min(pool, per_step)
    assert all(0 <= i < pool for i in got)


def test_skip_reasons() -> None:
    assert skip_reason(0, 0) == NO_PROMPTS
    assert skip_reason(3, 0) == NO_RESPONSE_TOKENS
    assert skip_reason(1, 1) is None


# ---- grpo_step ----------------------------------------------------------------------------


def step(
    prompts: list[str],
    sampler: ScriptedSampler,
    update: RecordingUpdate,
    reward: RewardFn = reward_by_text,
) -> StepOutcome:
    parts = step_parts(
        sampler, update, GRPOConfig(), group_size=3, max_new_tokens=7, pad_token_id=0
    )
    return grpo_step(parts, prompts, reward, seed=5, where="test step")


def test_a_step_without_prompts_is_skipped_before_sampling() -> None:
    sampler, update = ScriptedSampler(), RecordingUpdate()
    out = step([], sampler, update)
    assert out.skipped == NO_PROMPTS
    assert out.stats == {"skipped": 1.0, "skipped_no_prompts": 1.0}
    assert sampler.calls == [] and update.calls == []
    assert len(out.batch) == 0 and out.advantages.numel() == 0


def test_one_prompt_where_more_were_asked_is_an_ordinary_step() -> None:
    update = RecordingUpdate()
    out = step(["only"], ScriptedSampler(), update)
    assert out.skipped is None and "skipped" not in out.stats
    ((batch, advantages, _, _),) = update.calls
    assert len(batch) == 3 and advantages.shape == batch.response_mask.shape
    # outputs 0, 1, 2 get rewards 0, 1, 0: the middle one alone is pushed up
    assert (out.advantages[:, 0] > 0).tolist() == [False, True, False]


class EmptySampler(ScriptedSampler):
    """Every output has no token (e.g. max_new_tokens reached at once, an empty gold text)."""

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        batch = super().generate(prompts, n, params, seed)
        rows = len(batch)
        return RolloutBatch(
            batch.prompt_index,
            batch.prompt_ids,
            [[]] * rows,
            [""] * rows,
            ["length"] * rows,
            [[]] * rows,
        )


def zero_reward(batch: RolloutBatch) -> StepRewards:
    zeros = torch.zeros(len(batch))
    return StepRewards(zeros, {VERIFIER: zeros.clone()}, None)


def test_a_step_whose_outputs_are_all_empty_is_skipped_with_its_rewards_reported() -> None:
    update = RecordingUpdate()
    out = step(["a", "b"], EmptySampler(), update, zero_reward)
    assert out.skipped == NO_RESPONSE_TOKENS and update.calls == []
    assert out.stats == {
        "skipped": 1.0,
        "skipped_no_response_tokens": 1.0,
        "reward_mean": 0.0,
        "verifier_accuracy": 0.0,
        "equal_reward_groups": 1.0,
        # every output stopped at once (finish "length") with no token, none correct
        "truncated_fraction": 1.0,
        "length_wrong_mean": 0.0,
    }
    assert out.advantages.shape == (6, 0)


class TruncatedSampler(ScriptedSampler):
    """Every output stopped at max_new_tokens: tokens, but no answer (the verifier's 0)."""

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        batch = super().generate(prompts, n, params, seed)
        batch.finish_reasons = ["length"] * len(batch)
        return batch


def test_all_truncated_outputs_with_equal_rewards_update_on_zero_advantages() -> None:
    """No outcome gradient is still GRPO's update (the KL term pulls toward the reference):
    the step is made, with zero advantages, and says every group was equal."""
    update = RecordingUpdate()
    out = step(["a", "b"], TruncatedSampler(), update, zero_reward)
    assert out.skipped is None
    ((_, advantages, _, _),) = update.calls
    assert torch.count_nonzero(advantages) == 0
    assert out.stats["equal_reward_groups"] == 1.0


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_a_real_update_on_all_zero_advantages_is_finite(beta: float) -> None:
    """The update itself on a tiny Llama: zero advantages give a finite loss that still has a
    gradient graph (the original crash was a loss without one), policy loss 0, the KL term
    alone moving the policy when beta > 0."""
    model = tiny_llama(vocab=8, positions=16)
    ref = copy.deepcopy(model).eval() if beta > 0 else None
    cfg = GRPOConfig(beta=beta, lr=1e-2)
    engine = TorchEngine(model, OptimizerSettings(lr=cfg.lr, max_grad_norm=cfg.max_grad_norm))
    batch = build_policy_batch([[1, 2]] * 4, [[3, 4, 5], [4], [5, 6], [7, 3, 3]], pad_id=0)
    metrics = grpo_update(engine, ref, batch, torch.zeros(batch.response_mask.shape), cfg)
    assert all(math.isfinite(v) for v in metrics.values())
    assert metrics["policy_loss"] == 0.0
