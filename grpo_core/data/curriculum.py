"""A difficulty curriculum from pass rates (grpo.curriculum, docs/curriculum.md): each problem's
weight from how often the policy solved it before, and a seeded weighted draw of a stage's
prompts. Torch-free, so a config loads without torch."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

CurriculumMode = Literal["off", "pass_rate"]


class CurriculumSettings(BaseModel):
    """Which problems a GRPO stage draws: uniformly (off), or weighted by each question's pass
    rate over the run's earlier iterations (Kimi k1.5's curriculum sampling)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    mode: CurriculumMode = Field(
        default="off",
        description="'off': the stage's prompts drawn uniformly from the task, as before. "
        "'pass_rate': drawn from `candidates` x as many task problems, each with the weight "
        "max(floor, 4 p (1 - p)) of its question's pass rate p over the run's earlier "
        "iterations (1 for a question not sampled yet), so questions always solved or never "
        "solved, whose groups carry no advantage, are drawn less (table problem_pass_rates).",
    )
    candidates: int = Field(
        default=4,
        ge=1,
        le=64,
        description="pass_rate: the stage draws its steps x prompts_per_step problems from this "
        "many times as many task problems (1 to 64; 1 keeps every candidate, only reordered).",
    )
    floor: float = Field(
        default=0.1,
        gt=0.0,
        le=1.0,
        description="pass_rate: the least weight of a question (more than 0, at most 1): one "
        "always or never solved keeps this weight, so it is still drawn sometimes.",
    )


def question_key(question: str) -> str:
    """The key a question's pass rate is kept under: problem ids differ between draws of the
    same question (arith-train-<seed>-<index>), the question's text does not."""
    return hashlib.sha256(question.encode()).hexdigest()[:16]


def difficulty_weight(n_correct: int, n_samples: int, floor: float) -> float:
    """max(floor, 4 p (1 - p)) with p = n_correct / n_samples; 1 for an unseen question.

    4 p (1 - p) is the variance of a 1/0 reward scaled to 1 at p = 1/2: a group whose outputs
    are all right or all wrong has zero advantage for every output and teaches nothing.
    """
    if n_samples < 0 or not 0 <= n_correct <= n_samples:
        raise ValueError(f"need 0 <= n_correct <= n_samples (got {n_correct}, {n_samples})")
    if n_samples == 0:
        return 1.0
    p = n_correct / n_samples
    return max(floor, 4.0 * p * (1.0 - p))


def weighted_draw(weights: Sequence[float], count: int, rng: random.Random) -> list[int]:
    """`count` distinct indices drawn with probability proportional to their weights, one after
    another without replacement (Efraimidis and Spirakis 2006: the largest u ** (1 / w), u
    uniform on (0, 1)), in the order drawn."""
    if count > len(weights):
        raise ValueError(f"cannot draw {count} of {len(weights)} indices without replacement")
    if any(not w > 0 for w in weights):
        raise ValueError("every weight must be positive")
    # log(u) / w orders as u ** (1 / w) without underflow at small weights
    keys = [math.log(1.0 - rng.random()) / w for w in weights]
    return sorted(range(len(weights)), key=lambda i: keys[i], reverse=True)[:count]
