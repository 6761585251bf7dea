"""DAPO's step mechanics: the truncation mask (zero gradient for cut outputs) and dynamic
sampling (hand-made rounds, and Hypothesis properties of what it keeps). The formulas of the
overlong penalty, the length reward and process credit: test_length_and_credit.py."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.dynamic_sampling import (
    SampledRound,
    informative_groups,
    round_seed,
    sample_informative_groups,
)
from grpo_core.algo.estimators import VERIFIER
from grpo_core.algo.losses import grpo_loss
from grpo_core.algo.rewards import StepRewards
from grpo_core.algo.step import (
    ALL_GROUPS_EQUAL,
    ALL_TRUNCATED,
    grpo_step,
    prompt_indices_at,
    step_parts,
    step_prompt_indices,
)
from grpo_core.algo.update import grpo_update
from grpo_core.contracts.policy_batch import build_policy_batch
from grpo_core.contracts.rollout import RolloutBatch, SamplingParams
from grpo_core.contracts.training import OptimizerSettings
from grpo_core.engines.train import TorchEngine
from tests.grpo_core.algo.test_rewards import RecordingUpdate
from tests.models import tiny_llama

# ---- the truncation mask ------------------------------------------------------------------


class LengthSampler:
    """Outputs of 1, 2 or 3 tokens; the 3-token ones hit max_new_tokens = 3 ("length")."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], int]] = []

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        self.calls.append((prompts, seed))
        rows = len(prompts) * n
        completions = [[5 + r] * (1 + r % 3) for r in range(rows)]
        return RolloutBatch(
            prompt_index=[r // n for r in range(rows)],
            prompt_ids=[[1, 2] for _ in range(rows)],
            completion_ids=completions,
            texts=[f"{prompts[r // n]}:{r % n}" for r in range(rows)],
            finish_reasons=["length" if len(c) == 3 else "stop" for c in completions],
            logprobs=[[-0.5] * len(c) for c in completions],
        )


def reward_second_output(batch: RolloutBatch) -> StepRewards:
    """Output 1 of each group is right; prompts starting 'same' reward every output 0."""
    total = torch.tensor(
        [0.0 if t.startswith("same") else float(t.endswith(":1")) for t in batch.texts]
    )
    return StepRewards(total, {VERIFIER: total.clone()}, None)


def run(
    prompts: list[str], algo: GRPOConfig, sampler: LengthSampler, update: RecordingUpdate, **kw
):  # type: ignore[no-untyped-def]
    parts = step_parts(sampler, update, algo, group_size=3, max_new_tokens=3, pad_token_id=0)
    return grpo_step(parts, prompts, reward_second_output, seed=11, **kw)


def test_truncated_outputs_leave_the_loss_and_their_gradient_is_zero() -> None:
    update = RecordingUpdate()
    out = run(["a", "b"], GRPOConfig(mask_truncated=True, beta=0.04), LengthSampler(), update)
    assert out.truncated == [False, False, True] * 2
    ((batch, advantages, _, _),) = update.calls
    assert batch.response_mask[[2, 5]].sum() == 0  # rows 2 and 5 were cut
    assert batch.response_mask[[0, 1, 3, 4]].sum() == 1 + 2 + 1 + 2
    assert advantages[[2, 5]].abs().sum() == 0 and out.advantages[[2, 5]].abs().sum() == 0
    # the loss's gradient, policy and KL term, reaches no token of a truncated row
    logp = torch.full(batch.response_mask.shape, -0.7, requires_grad=True)
    ref = torch.full(batch.response_mask.shape, -0.2)
    cfg = GRPOConfig(mask_truncated=True, beta=0.04, loss_agg="token-mean")
    loss, _ = grpo_loss(logp, logp.detach() - 0.1, ref, advantages, batch.response_mask, cfg)
    loss.backward()
    assert logp.grad is not None
    assert logp.grad[[2, 5]].abs().sum() == 0
    assert logp.grad[[0, 1, 3, 4]].abs().sum() > 0
    # token-mean over the 6 kept tokens only: the cut rows are not in the denominator either
    kept = torch.tensor([0, 1, 3, 4])
    alone, _ = grpo_loss(
        logp[kept].detach(),
        logp[kept].detach() - 0.1,
        ref[kept],
        advantages[kept],
        batch.response_mask[kept],
        cfg,
    )
    assert float(loss.detach()) == pytest.approx(float(alone))


def test_without_the_mask_truncated_outputs_train() -> None:
    update = RecordingUpdate()
    run(["a"], GRPOConfig(), LengthSampler(), update)
    ((batch, _, _, _),) = update.calls
    assert batch.response_mask[2].sum() == 3


@pytest.mark.usefixtures("one_torch_thread")
def test_a_real_update_ignores_what_a_masked_row_holds() -> None:
    """On a tiny Llama, micro-batches of one row: with row 2 masked out, whatever its tokens
    and advantage, the update moves the weights exactly as the batch without it does."""

    base = tiny_llama(vocab=8, positions=16)
    cfg = GRPOConfig(beta=0.0, lr=1e-2, loss_agg="token-mean", micro_batch_size=1)

    def updated(completions: list[list[int]], advantage: list[float], keep: list[float]):  # type: ignore[no-untyped-def]
        torch.manual_seed(0)
        model = copy.deepcopy(base)
        engine = TorchEngine(model, OptimizerSettings(lr=cfg.lr, max_grad_norm=cfg.max_grad_norm))
        batch = build_policy_batch([[1, 2]] * len(completions), completions, pad_id=0)
        masked = torch.tensor(keep).reshape(-1, 1) * batch.response_mask
        batch = replace(batch, response_mask=masked)
        advantages = torch.tensor(advantage).reshape(-1, 1) * batch.response_mask
        grpo_update(engine, None, batch, advantages, cfg)
        return [p.detach().clone() for p in model.parameters()]

    kept = [[3, 4, 5], [4, 6]]
    one = updated([*kept, [7, 7, 7]], [1.0, -1.0, 5.0], [1.0, 1.0, 0.0])
    other = updated([*kept, [6, 3]], [1.0, -1.0, -9.0], [1.0, 1.0, 0.0])
    alone = updated(kept, [1.0, -1.0], [1.0, 1.0])
    assert all(torch.equal(a, b) for a, b in zip(one, other, strict=True))
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(one, alone, strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(one, base.parameters(), strict=True))


class AllLongSampler(LengthSampler):
    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        batch = super().generate(prompts, n, params, seed)
        batch.finish_reasons = ["length"] * len(batch)
        return batch


def test_every_output_truncated_and_masked_is_a_skipped_step() -> None:
    update = RecordingUpdate()
    out = run(["a"], GRPOConfig(mask_truncated=True), AllLongSampler(), update)
    assert out.skipped == ALL_TRUNCATED and update.calls == []
    assert out.stats["truncated_fraction"] == 1.0


# ---- dynamic sampling in a step -----------------------------------------------------------


def test_dynamic_sampling_replaces_equal_groups_with_further_prompts() -> None:
    asked: list[tuple[int, int]] = []
    supply = iter(["same-x", "c", "d"])

    def more(round_index: int, count: int):  # type: ignore[no-untyped-def]
        asked.append((round_index, count))
        return [next(supply) for _ in range(count)], reward_second_output

    sampler, update = LengthSampler(), RecordingUpdate()
    algo = GRPOConfig(dynamic_sampling=True, dynamic_sampling_max_rounds=3)
    out = run(["same-a", "b", "same-b"], algo, sampler, update, more_prompts=more)
    # round 0: same-a, b, same-b -> b kept, 2 missing; round 1: same-x, c -> c kept, 1
    # missing; round 2: d -> kept. Drawn order: same-a b same-b same-x c d -> kept 1, 4, 5
    assert asked == [(1, 2), (2, 1)]
    assert out.kept_prompts == [1, 4, 5]
    assert [p for p, _ in sampler.calls] == [["same-a", "b", "same-b"], ["same-x", "c"], ["d"]]
    assert [s for _, s in sampler.calls] == [11, round_seed(11, 1), round_seed(11, 2)]
    assert out.batch.prompt_index == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [t.split(":")[0] for t in out.batch.texts[::3]] == ["b", "c", "d"]
    assert out.stats["prompts_drawn"] == 6 and out.stats["groups_dropped"] == 3
    assert out.stats["sampling_rounds"] == 3 and out.stats["batch_filled"] == 1.0
    ((batch, _, _, _),) = update.calls
    assert len(batch) == 9


def test_dynamic_sampling_at_its_cap_trains_on_what_it_has() -> None:
    def more(round_index: int, count: int):  # type: ignore[no-untyped-def]
        return ["same"] * count, reward_second_output

    update = RecordingUpdate()
    algo = GRPOConfig(dynamic_sampling=True, dynamic_sampling_max_rounds=2)
    out = run(["same", "b"], algo, LengthSampler(), update, more_prompts=more)
    assert out.kept_prompts == [1] and out.skipped is None
    assert out.stats["sampling_rounds"] == 3 and out.stats["batch_filled"] == 0.0
    assert out.stats["prompts_drawn"] == 4 and out.stats["groups_dropped"] == 3


def test_dynamic_sampling_with_no_informative_group_skips_the_step() -> None:
    update = RecordingUpdate()
    algo = GRPOConfig(dynamic_sampling=True)
    out = run(["same-a", "same-b"], algo, LengthSampler(), update)  # no more_prompts: no rounds
    assert out.skipped == ALL_GROUPS_EQUAL and update.calls == []
    assert len(out.batch) == 6  # the first round's outputs are still reported
    assert out.stats["batch_filled"] == 0.0 and out.stats["sampling_rounds"] == 1


def test_a_first_round_seed_is_the_step_seed() -> None:
    assert round_seed(123, 0) == 123
    assert round_seed(123, 1) != round_seed(123, 2) != 123
    assert round_seed(123, 1) == round_seed(123, 1)


def test_informative_groups_by_hand() -> None:
    # groups: [1, 1] equal, [0, 1] not, [2] one output, [0.5, 0.5 + 1e-7] equal within tol
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 0.5, 0.5 + 1e-7])
    assert informative_groups(rewards, [0, 0, 1, 1, 2, 3, 3], 4) == [1]


def test_the_prompt_cursor_is_step_prompt_indices_without_extra_rounds() -> None:
    for step in range(5):
        assert prompt_indices_at(7, step * 3, 3) == step_prompt_indices(7, step, 3)
    assert prompt_indices_at(5, 9, 3) == [4, 0, 1]


# ---- dynamic sampling: properties ---------------------------------------------------------

group_rewards = st.lists(st.sampled_from([0.0, 1.0, 0.5]), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None)
@given(
    pool=st.lists(group_rewards, max_size=30),
    target=st.integers(1, 6),
    cap=st.integers(0, 4),
)
def test_kept_groups_are_unequal_and_the_batch_is_full_or_the_cap_reached(
    pool: list[list[float]], target: int, cap: int
) -> None:
    taken = 0
    sizes: list[int] = []

    def draw(round_index: int, count: int) -> SampledRound:
        nonlocal taken
        groups = pool[taken : taken + count]
        taken += len(groups)
        sizes.append(len(groups))
        rows = [(p, r) for p, g in enumerate(groups) for r in g]
        total = torch.tensor([r for _, r in rows])
        batch = RolloutBatch(
            [p for p, _ in rows],
            [[1]] * len(rows),
            [[2]] * len(rows),
            [str(r) for _, r in rows],
            ["stop"] * len(rows),
            [[-1.0]] * len(rows),
        )
        return SampledRound(len(groups), batch, StepRewards(total, {VERIFIER: total}, None))

    found = sample_informative_groups(draw, target, cap)
    kept_groups = [pool[i] for i in found.kept]
    assert all(max(g) - min(g) > 0 for g in kept_groups)  # every kept group is unequal
    exhausted = sizes[-1] == 0 or taken == len(pool)
    assert found.filled == (len(found.kept) == target)
    assert found.filled or found.rounds == cap + 1 or exhausted
    assert len(found.kept) <= target and found.rounds <= cap + 1
    assert found.rounds == sum(1 for n in sizes if n > 0)  # a round that drew nothing is none
    assert found.prompts_drawn == taken == sum(sizes)
    assert found.groups_dropped == taken - len(found.kept)
    assert found.kept == sorted(found.kept) and all(0 <= i < taken for i in found.kept)
    # the batch holds exactly the kept groups' outputs, in order, renumbered
    assert found.rewards.total.tolist() == [r for g in kept_groups for r in g]
    assert found.batch.prompt_index == [q for q, g in enumerate(kept_groups) for _ in g]
    # no informative group was passed over while the batch still had room
    if not found.filled:
        skipped = [i for i in range(taken) if i not in found.kept]
        assert all(max(pool[i]) == min(pool[i]) for i in skipped)


@pytest.mark.parametrize("estimator", ["rft", "online_rft", "sft"])
def test_dynamic_sampling_is_refused_where_equal_groups_still_teach(estimator: str) -> None:
    with pytest.raises(ValueError, match="dynamic_sampling: false"):
        GRPOConfig(adv_estimator=estimator, dynamic_sampling=True)


def test_kept_groups_carry_their_learned_step_and_token_rewards_across_rounds() -> None:
    """Under process supervision a kept group's PRM step rewards, step ends and RM scores
    travel with its outputs, whichever round sampled it; so do per-token rewards."""

    def round_of(rewards: list[float], tag: str) -> SampledRound:
        n = len(rewards)
        total = torch.tensor(rewards)
        batch = RolloutBatch(
            [r // 2 for r in range(n)],
            [[1]] * n,
            [[2, 3]] * n,
            [f"{tag}{r}" for r in range(n)],
            ["stop"] * n,
            [[-1.0, -1.0]] * n,
        )
        steps = [[float(r), 0.5] for r in range(n)]
        ends = [[0, 1]] * n
        rm = total / 10
        tokens = [[float(r), -float(r)] for r in range(n)]
        return SampledRound(
            n // 2, batch, StepRewards(total, {VERIFIER: total.clone()}, rm, steps, ends, tokens)
        )

    # round 0: groups [1, 1] (equal) and [0, 1] (kept); round 1: group [2, 3] (kept)
    rounds = [round_of([1.0, 1.0, 0.0, 1.0], "a"), round_of([2.0, 3.0], "b")]
    found = sample_informative_groups(lambda i, count: rounds[i], 2, 1)
    assert found.kept == [1, 2] and found.batch.texts == ["a2", "a3", "b0", "b1"]
    assert found.rewards.total.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert found.rewards.rm is not None
    assert found.rewards.rm.tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert found.rewards.step_scores == [[2.0, 0.5], [3.0, 0.5], [0.0, 0.5], [1.0, 0.5]]
    assert found.rewards.step_ends == [[0, 1]] * 4
    assert found.rewards.token_rewards == [[2.0, -2.0], [3.0, -3.0], [0.0, -0.0], [1.0, -1.0]]
