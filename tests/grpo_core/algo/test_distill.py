"""On-policy distillation against docs/algorithm.md section 14: the per-token reverse-KL
reward, the `distill` estimator, and how per-token parts reach a step's advantages."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_core.algo.advantages import AdvantageInputs, pad_token_rewards
from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.distill import distill_estimator, reverse_kl_rewards
from grpo_core.algo.estimators import ADVANTAGE_ESTIMATORS, VERIFIER
from grpo_core.algo.rewards import StepRewards, reward_stats, token_advantages, token_rewards

log = math.log


def test_reverse_kl_rewards_by_hand_spec_14() -> None:
    # token 1: teacher 0.5, student 0.25 -> log 2; token 2: teacher 0.1, student 0.4 -> -log 4;
    # a token both give 0.9 earns 0; an empty output has no reward
    teacher = [[log(0.5), log(0.1)], [log(0.9)], []]
    student = [[log(0.25), log(0.4)], [log(0.9)], []]
    got = reverse_kl_rewards(teacher, student)
    assert got[0] == pytest.approx([0.6931, -1.3863], abs=1e-4)
    assert got[1:] == [[0.0], []]


def test_reverse_kl_rewards_refuse_outputs_of_other_lengths() -> None:
    with pytest.raises(ValueError, match="output 0: 1 teacher log-probs for 2 sampled tokens"):
        reverse_kl_rewards([[-1.0]], [[-1.0, -2.0]])
    with pytest.raises(ValueError, match="2 outputs of teacher log-probs for 1"):
        reverse_kl_rewards([[], []], [[]])


def test_the_distill_estimator_puts_each_tokens_reward_on_it_spec_14() -> None:
    # two outputs of one group with the same rewards: no baseline, so they keep them
    # (a group-relative estimator would give both 0); padding gets 0
    rewards = pad_token_rewards([[0.5, -1.0, 0.25], [0.5, -1.0]], 3)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    got = distill_estimator(AdvantageInputs(response_mask=mask, token_rewards=rewards), 1e-4)
    assert got.tolist() == [[0.5, -1.0, 0.25], [0.5, -1.0, 0.0]]


def test_the_distill_estimator_is_registered_with_what_it_reads() -> None:
    spec = ADVANTAGE_ESTIMATORS["distill"]
    assert spec.fn is distill_estimator
    assert spec.needs_token_rewards and not spec.needs_weighted_reward
    assert spec.data_sources == {"online"}  # on-policy: the student's own samples
    with pytest.raises(ValueError, match=r"needs AdvantageInputs\.token_rewards"):
        spec.fn(AdvantageInputs(response_mask=torch.ones(1, 2)), 1e-4)


def test_per_token_parts_are_weighted_and_summed_in_order() -> None:
    teacher = [[0.5, -1.0], [2.0]]
    other = [[1.0, 1.0], [-4.0]]
    assert token_rewards([(2.0, teacher), (0.5, other)]) == [[1.5, -1.5], [2.0]]
    assert token_rewards([]) is None
    with pytest.raises(ValueError, match="the same tokens"):
        token_rewards([(1.0, teacher), (1.0, [[1.0], [1.0]])])


def test_a_steps_token_rewards_reach_the_advantages_and_the_metrics() -> None:
    per_token = [[0.5, -1.0], [-0.25], [], [0.0, 0.0]]
    rewards = StepRewards(
        total=torch.tensor([-0.5, -0.25, 0.0, 0.0]),
        parts={VERIFIER: torch.tensor([1.0, 0.0, 0.0, 1.0])},
        rm=None,
        token_rewards=per_token,
    )
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    advantages = token_advantages(GRPOConfig(adv_estimator="distill"), rewards, mask, (2, 2))
    assert advantages.tolist() == [[0.5, -1.0], [-0.25, 0.0], [0.0, 0.0], [0.0, 0.0]]
    # the mean over the five response tokens
    assert reward_stats(rewards, 2)["token_reward_mean"] == pytest.approx(-0.75 / 5)
    without = StepRewards(rewards.total, rewards.parts, None)
    assert "token_reward_mean" not in reward_stats(without, 2)


def vector(n: int) -> st.SearchStrategy[list[float]]:
    return st.lists(st.floats(-6.0, 6.0), min_size=n, max_size=n)


# the logits of a student and a teacher over one vocabulary of 2 to 8 tokens
logit_pairs = st.integers(2, 8).flatmap(lambda n: st.tuples(vector(n), vector(n)))


def one_token_outputs(teacher: torch.Tensor, student: torch.Tensor) -> list[list[float]]:
    """The reward of each vocabulary entry sampled as a one-token output."""
    return reverse_kl_rewards([[t] for t in teacher.tolist()], [[s] for s in student.tolist()])


@settings(deadline=None, max_examples=50)
@given(logit_pairs)
def test_the_expected_reward_is_minus_the_reverse_kl_and_never_positive(
    pair: tuple[list[float], list[float]],
) -> None:
    """Over the student's own samples, E[r] = -KL(student || teacher) <= 0."""
    student = torch.tensor(pair[0], dtype=torch.float64).log_softmax(-1)
    teacher = torch.tensor(pair[1], dtype=torch.float64).log_softmax(-1)
    rewards = one_token_outputs(teacher, student)
    expected = sum(p * r[0] for p, r in zip(student.exp().tolist(), rewards, strict=True))
    kl = float((student.exp() * (student - teacher)).sum())
    assert expected == pytest.approx(-kl, abs=1e-9)
    assert expected <= 1e-12


@settings(deadline=None, max_examples=30)
@given(st.integers(2, 8).flatmap(vector))
def test_a_teacher_equal_to_the_student_rewards_nothing(logits: list[float]) -> None:
    same = torch.tensor(logits, dtype=torch.float64).log_softmax(-1)
    assert one_token_outputs(same, same) == [[0.0]] * len(logits)


@settings(deadline=None, max_examples=30)
@given(logit_pairs)
def test_the_policy_gradient_of_the_advantages_is_minus_the_reverse_kls_gradient(
    pair: tuple[list[float], list[float]],
) -> None:
    """With A = r (the distill estimator's, detached), E_student[A grad log p_student] is
    -grad KL(student || teacher): the update descends the reverse KL."""
    theta = torch.tensor(pair[0], dtype=torch.float64, requires_grad=True)
    teacher = torch.tensor(pair[1], dtype=torch.float64).log_softmax(-1)
    student = theta.log_softmax(-1)
    rewards = one_token_outputs(teacher, student.detach())
    advantage = torch.tensor([r[0] for r in rewards], dtype=torch.float64)
    surrogate = (student.exp().detach() * advantage * student).sum()
    (surrogate_grad,) = torch.autograd.grad(surrogate, theta)
    student = theta.log_softmax(-1)
    (kl_grad,) = torch.autograd.grad((student.exp() * (student - teacher)).sum(), theta)
    assert surrogate_grad.tolist() == pytest.approx((-kl_grad).tolist(), abs=1e-9)
