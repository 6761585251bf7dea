"""The teacher part of on-policy distillation (docs/distillation.md): per response token, the
teacher's log-prob of the token the student sampled minus the student's own (one sample of
minus the token's reverse KL); with grpo.algo.adv_estimator: distill each token's reward is its
advantage. Use it
with its weight, grpo.rewards.teacher, and the teacher's checkpoint, grpo.rewards.teacher_path."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from grpo_core.contracts.errors import SettingError
from grpo_core.contracts.paths import LocalPath
from reward_models.parts.base import RewardPart, ScoringContext

if TYPE_CHECKING:
    from grpo_core.model.teacher import Teacher

TEACHER = "teacher"


def load_teacher_of(options: Mapping[str, Any], device: str) -> Teacher:
    """The teacher checkpoint of grpo.rewards.teacher_path on the stage's device."""
    from grpo_core.model.teacher import load_teacher

    if not options["path"]:
        raise SettingError(
            "grpo.rewards.teacher > 0 needs grpo.rewards.teacher_path: the directory of the "
            "teacher's checkpoint (e.g. a run's policy_N)"
        )
    return load_teacher(options["path"], device, options["dtype"], options["micro_batch_size"])


def teacher_token_scores(context: ScoringContext, options: Mapping[str, Any]) -> list[list[float]]:
    """log p_teacher(y_t) - log p_student(y_t) of each sampled token; the student's log-probs
    are the sampler's (temperature applied), the teacher's at the same temperature."""
    from grpo_core.algo.distill import reverse_kl_rewards

    teacher: Teacher = context.loaded[TEACHER]
    batch = context.batch
    teacher_logprobs = teacher.token_logprobs(
        batch.prompt_ids, batch.completion_ids, context.temperature
    )
    return reverse_kl_rewards(teacher_logprobs, batch.logprobs)


PART = RewardPart(
    name=TEACHER,
    score=None,
    token_score=teacher_token_scores,
    load=load_teacher_of,
    description="Weight of the teacher's per-token reward (>= 0; on-policy distillation): "
    "log p_teacher - log p_student of each sampled token (one sample of -reverse KL). Read per "
    "token by adv_estimator: distill; as one reward per output (its tokens' sum) by the others.",
    options={
        "path": (
            LocalPath,
            Field(
                None,
                description="The teacher's checkpoint: a local HF model directory (a run's "
                "policy_N, another model) whose tokenizer has the student's vocabulary; "
                "relative: to the current directory, stored absolute.",
            ),
        ),
        "dtype": (
            Literal["float32", "bfloat16", "float16"],
            Field("float32", description="The teacher's parameter dtype (float32 on CPU)."),
        ),
        "micro_batch_size": (
            int | None,
            Field(
                None,
                ge=1,
                description="Outputs per teacher forward pass (memory only); empty: all of a "
                "step's at once.",
            ),
        ),
    },
)
