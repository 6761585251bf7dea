"""The task contract: seeded problems with gold answers, answer checking, exact step labels."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from grpo_core.contracts.errors import UserError
from grpo_core.data.answer_formats import AnswerFormat

Split = Literal["train", "test"]


class TaskDataError(UserError, ValueError):
    """A task's data (a file, a generator's options) the pipeline cannot use, named by file
    and line where there is one."""


@dataclass(frozen=True)
class Problem:
    """One prompt of a task with its gold answer.

    `question` is the raw question text (no chat template, no answer cue); the policy's
    prompt formatter turns it into model input. `solution` is a gold GSM8K-style solution
    (one step per line, last line `#### <answer>`) when the task has one.
    """

    problem_id: str
    question: str
    answer: str
    solution: str | None = None
    meta: dict[str, str] = field(default_factory=dict)


class Task(Protocol):
    """What the pipeline needs from a task (built-in `arith`, reasoning-gym, local files)."""

    name: str
    answer_format: AnswerFormat  # how outputs state their final answer and how it is judged

    def problems(self, split: Split, n: int, seed: int) -> list[Problem]:
        """`n` problems of `split`, identical for the same (split, n, seed)."""
        ...

    def is_correct(self, problem: Problem, completion: str) -> bool:
        """True when the completion's final answer (in answer_format) equals the gold answer."""
        ...

    def step_labels(self, problem: Problem, completion: str) -> list[bool] | None:
        """Exact correctness of each step (line) of `completion`, or None if unknown."""
        ...
