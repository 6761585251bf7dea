"""The task contract: seeded problems with gold answers, answer checking, exact step labels;
and the task registry, where each task declares its settings section and its builder."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

from pydantic import BaseModel

from grpo_core.contracts.errors import UserError
from grpo_core.contracts.registry import Registry
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


Settings = TypeVar("Settings", bound=BaseModel)


@dataclass(frozen=True)
class TaskCommon:
    """The knobs every task reads: task.test_fraction and task.answer_format."""

    test_fraction: float
    answer_format: str  # "auto" or an answer format's name


@dataclass(frozen=True)
class TaskSpec(Generic[Settings]):
    """A registered task: its settings section (`task.<name>`, a pydantic model of its own
    knobs), its builder `(settings, common) -> Task`, and what it declares.

    answer_format: the format its gold answers are written in (task.answer_format may only be
    auto or this); None: any, the run's data decides (local_files).
    needs: fields of its section that must be set when it is the task chosen.
    earlier_keys: its knobs as earlier versions named them in the flat task section
    (task.rg_task) -> the field of its section they now are (dataset), so old configs load.
    data_paths: fields of its section that name data on disk (a file or folder): a run records
    a fingerprint of each and refuses to resume or fork on changed data (flows/data_identity.py).
    """

    name: str
    settings: type[Settings]
    build: Callable[[Settings, TaskCommon], Task]
    summary: str  # one line for task.name's description
    answer_format: str | None = None
    needs: tuple[str, ...] = ()
    earlier_keys: Mapping[str, str] = field(default_factory=dict)
    data_paths: tuple[str, ...] = ()


TASKS: Registry[TaskSpec[Any]] = Registry("task")


def register_task(spec: TaskSpec[Settings]) -> TaskSpec[Settings]:
    """Register `spec`; it is then `task.name: <name>`, its knobs `task.<name>.*`."""
    TASKS.add(spec.name, spec)
    return spec
