"""A toy task registered by tests, as docs/extending.md's "A new task" writes one: questions
`What is n+1?`, its one knob the largest n. Its settings section is `task.plus_one`."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from pydantic import BaseModel, ConfigDict, Field

from grpo_core.data.answer_formats import ANSWER_FORMATS
from grpo_core.data.tasks import TASKS, Problem, Split, TaskCommon, TaskSpec, register_task
from grpo_core.data.tasks.splits import split_of


class PlusOneSettings(BaseModel):
    """The plus_one task's knobs."""

    model_config = ConfigDict(extra="forbid")

    largest: int = Field(default=50, ge=10, description="n is drawn from 1..largest.")


class PlusOneTask:
    """`What is n+1?`, answered `n+1=m` then `#### m`."""

    name = "plus_one"
    answer_format = ANSWER_FORMATS["gsm8k"]

    def __init__(self, largest: int, test_fraction: float) -> None:
        self.largest, self.test_fraction = largest, test_fraction

    def problems(self, split: Split, n: int, seed: int) -> list[Problem]:
        rng = random.Random(f"plus_one/{split}/{seed}")
        out: list[Problem] = []
        while len(out) < n:
            k = rng.randint(1, self.largest)
            question = f"What is {k}+1?"
            if split_of(question, self.test_fraction) == split:
                solution = f"{k}+1={k + 1}\n#### {k + 1}"
                pid = f"plus_one-{split}-{seed}-{len(out)}"
                out.append(Problem(pid, question, str(k + 1), solution))
        return out

    def is_correct(self, problem: Problem, completion: str) -> bool:
        return self.answer_format.is_correct(problem.answer, completion)

    def step_labels(self, problem: Problem, completion: str) -> list[bool] | None:
        return None  # no exact step labels: the PRM learns from Math-Shepherd's estimates


def build(settings: PlusOneSettings, common: TaskCommon) -> PlusOneTask:
    return PlusOneTask(settings.largest, common.test_fraction)


PLUS_ONE = TaskSpec(
    name="plus_one",
    settings=PlusOneSettings,
    build=build,
    summary="toy: what is n+1",
    answer_format="gsm8k",  # its gold answers' format: task.answer_format may be auto or this
)


@pytest.fixture
def plus_one() -> Iterator[str]:
    """The toy task registered for one test (and unregistered after it)."""
    register_task(PLUS_ONE)
    yield PLUS_ONE.name
    TASKS.remove(PLUS_ONE.name)
