"""The task contract: seeded problems with gold answers, answer checking, exact step labels
(and, for a task read from rows of data, every row listed and left out by id); and the task
registry, where each task declares its settings section and its builder."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel

from grpo_core.contracts.errors import UserError
from grpo_core.contracts.registry import Registry
from grpo_core.data.answer_formats import AnswerFormat

Split = Literal["train", "test"]
OnBadRows = Literal["refuse", "drop"]  # what a task read from rows does with the unusable ones


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


@runtime_checkable
class RowTask(Task, Protocol):
    """A task whose problems are the rows of its data (local_files), not a generator's draws:
    every problem a run can draw is listed, so the pre-flight checks each one, and a row the
    run cannot use is left out or refused, as its settings say (`on_bad_rows`)."""

    on_bad_rows: OnBadRows

    def every_problem(self, split: Split) -> list[Problem]:
        """Every problem `split` can draw, in the data's order."""
        ...

    def row_of(self, problem: Problem) -> str:
        """Where `problem`'s row is, for messages: FILE:LINE or FILE row N."""
        ...

    def without(self, problem_ids: Collection[str]) -> RowTask:
        """This task with those problems left out: draws keep the seeded order of the rest,
        and the problem ids of the rest are unchanged."""
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
    earlier_values: a field of its section -> the values earlier versions named otherwise ->
    their names now (on_bad_rows: error -> refuse), so old configs load as this version's.
    """

    name: str
    settings: type[Settings]
    build: Callable[[Settings, TaskCommon], Task]
    summary: str  # one line for task.name's description
    answer_format: str | None = None
    needs: tuple[str, ...] = ()
    earlier_keys: Mapping[str, str] = field(default_factory=dict)
    data_paths: tuple[str, ...] = ()
    earlier_values: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


TASKS: Registry[TaskSpec[Any]] = Registry("task")


def register_task(spec: TaskSpec[Settings]) -> TaskSpec[Settings]:
    """Register `spec`; it is then `task.name: <name>`, its knobs `task.<name>.*`."""
    TASKS.add(spec.name, spec)
    return spec
