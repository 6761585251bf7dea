"""On-policy distillation (docs/algorithm.md section 14; Agarwal et al. 2024, GKD, and
Thinking Machines' "On-policy distillation"): a teacher's per-token reverse-KL reward on the
student's own samples, and the `distill` estimator that makes each token's reward its advantage.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from grpo_core.algo.advantages import AdvantageInputs, _require


def reverse_kl_rewards(
    teacher_logprobs: Sequence[Sequence[float]], student_logprobs: Sequence[Sequence[float]]
) -> list[list[float]]:
    """Spec section 14: r_t = log p_teacher(y_t) - log p_student(y_t) of each sampled token
    y_t, minus the one-sample estimate of the token's reverse KL(student || teacher); one list
    per output, one value per response token."""
    if len(teacher_logprobs) != len(student_logprobs):
        raise ValueError(
            f"{len(teacher_logprobs)} outputs of teacher log-probs for "
            f"{len(student_logprobs)} outputs of the student's"
        )
    rewards = []
    for row, (teacher, student) in enumerate(zip(teacher_logprobs, student_logprobs, strict=True)):
        if len(teacher) != len(student):
            raise ValueError(
                f"output {row}: {len(teacher)} teacher log-probs for {len(student)} sampled tokens"
            )
        rewards.append([t - s for t, s in zip(teacher, student, strict=True)])
    return rewards


def distill_estimator(inputs: AdvantageInputs, eps: float) -> Tensor:
    """Spec section 14: A_{i,t} = r_{i,t}, each token's own reward (discount 0, no group
    baseline, no normalisation); 0 on padding."""
    rewards = _require(inputs.token_rewards, "token_rewards", "distill")
    return rewards.to(torch.float32) * inputs.response_mask.to(torch.float32)
