"""Build a task from its config: `make_task(TaskConfig(name="arith", ...))`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from grpo_core.data.answer_formats import ANSWER_FORMATS
from grpo_core.data.tasks.arith import ArithTask
from grpo_core.data.tasks.base import Task
from grpo_core.data.tasks.data_formats import AUTO, DATA_FORMATS
from grpo_core.data.tasks.math_style import KINDS, MathKind, MathStyleTask
from grpo_core.data.tasks.reasoning_gym import ReasoningGymTask

# The answer format each generated task writes its gold answers in (local_files: the config's).
_OWN_FORMATS = {
    "arith": ArithTask.answer_format.name,
    "reasoning_gym": ReasoningGymTask.answer_format.name,
    "math_style": MathStyleTask.answer_format.name,
}


def _with_auto(names: Callable[[], list[str]]) -> Callable[[dict[str, Any]], None]:
    """Pydantic `json_schema_extra`: `auto` and a registry's names as the field's choices."""

    def extra(schema: dict[str, Any]) -> None:
        schema["enum"] = [AUTO, *names()]

    return extra


class TaskColumns(BaseModel):
    """Which column of local data holds each part of a problem; unset: the data format's."""

    model_config = ConfigDict(extra="forbid")

    question: str | None = Field(
        default=None, description="The question (gsm8k: 'question'; math: 'problem')."
    )
    solution: str | None = Field(
        default=None,
        description="The worked solution, trained on by warm start and read for the gold "
        "answer when there is no answer column (gsm8k: 'answer', ending '#### <number>'; "
        "math: 'solution', its last \\boxed{}).",
    )
    answer: str | None = Field(
        default=None,
        description="The final answer alone, used as the gold answer when a row has it "
        "(gsm8k: none; math: 'answer' when the data has it). A dotted name "
        "(reward_model.ground_truth) reads a field of a struct column, for every role.",
    )


class TaskConfig(BaseModel):
    """Which task to train and evaluate on, and its difficulty knobs."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: Literal["arith", "math_style", "reasoning_gym", "local_files"] = Field(
        default="arith",
        description="arith: built-in arithmetic chains; math_style: built-in fraction sums, "
        "radical sums and midpoints with \\boxed{} LaTeX answers; reasoning_gym: a "
        "reasoning-gym dataset (needs itergrpo[real]); local_files: GSM8K- or MATH-format "
        "data on local disk (jsonl/json/parquet files or a datasets folder; docs/data.md).",
    )
    min_steps: int = Field(
        default=2, ge=1, le=20, description="arith: fewest operations per chain (1-20)."
    )
    max_steps: int = Field(
        default=4,
        ge=1,
        le=20,
        description="arith: most operations per chain (>= min_steps, <= 20).",
    )
    operand_max: int = Field(
        default=9,
        ge=1,
        le=10**6,
        description="arith: operands are drawn from 1..operand_max (9: one digit).",
    )
    operators: str = Field(
        default="+-", description="arith: operators to draw from, a non-empty subset of '+-*'."
    )
    distinct_test: bool = Field(
        default=False,
        description="arith: draw no test question twice within an evaluation (the policy's, "
        "the reward models' drift measurement); refused when the test split has fewer "
        "different questions than asked. Off: test draws repeat (a small family has few). "
        "Training draws always repeat.",
    )
    math_kinds: list[MathKind] = Field(
        default_factory=lambda: list(KINDS),
        min_length=1,
        description="math_style: which kinds of question to draw (each problem's kind "
        "uniformly): fraction_sum (\\frac{1}{2}+\\frac{1}{3}), radical_sum "
        "(\\sqrt{8}+\\sqrt{2}), midpoint (of two points: a pair of fractions).",
    )
    math_max: int = Field(
        default=4,
        ge=2,
        le=12,
        description="math_style: largest number in a question (2-12): fraction denominators "
        "2..math_max, root coefficients 1..math_max, point coordinates 0..math_max.",
    )
    test_fraction: float = Field(
        default=0.2,
        gt=0.0,
        lt=1.0,
        description="Share of all questions held out as test, by hash (0-1).",
    )
    rg_task: Literal["chain_sum", "basic_arithmetic", "gsm_symbolic"] = Field(
        default="chain_sum", description="reasoning_gym: which dataset."
    )
    rg_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="reasoning_gym: generator options, e.g. {'min_terms': 2, 'max_terms': 2}.",
    )
    path: str | None = Field(
        default=None,
        description="local_files: a .jsonl/.json(.gz)/.parquet file, or a folder written by "
        "datasets' save_to_disk (a Dataset, or a DatasetDict whose train/test splits are used) "
        "or holding data files that datasets.load_dataset reads (splits by file name).",
    )
    test_path: str | None = Field(
        default=None,
        description="local_files: optional test data (a file or folder); else the data's own "
        "test split, else a hash split of path by test_fraction.",
    )
    data_format: str = Field(
        default=AUTO,
        description="local_files: the data's format, which gives its default columns and "
        "answer format: "
        + "; ".join(f"{name}: {f.description}" for name, f in DATA_FORMATS.items())
        + ". auto: the format whose columns the data has.",
        json_schema_extra=_with_auto(DATA_FORMATS.names),
    )
    columns: TaskColumns = Field(
        default_factory=TaskColumns,
        description="local_files: the column of each part of a problem, where the data names "
        "them otherwise than its format (task.columns.question: prompt).",
    )
    file_reader: Literal["itergrpo", "datasets"] = Field(
        default="itergrpo",
        description="local_files: who reads a file. itergrpo: .jsonl/.json(.gz)/.parquet, bad "
        "rows named FILE:LINE; datasets: datasets.load_dataset (also .csv, .arrow), rows named "
        "FILE row N. Folders are always read with datasets.",
    )
    answer_format: str = Field(
        default=AUTO,
        description="How outputs state their final answer and how it is judged "
        "(grpo_core/data/answer_formats.py): 'gsm8k' (a last line '#### <answer>', compared as "
        "numbers) or 'boxed' (the last \\boxed{...}, compared by math-verify: 1/2 = 0.5 = "
        "\\frac12). auto: the task's own; arith and reasoning_gym state answers as gsm8k, "
        "math_style as boxed; local_files as its data format does (gsm8k: gsm8k, math: boxed).",
        json_schema_extra=_with_auto(ANSWER_FORMATS.names),
    )
    on_bad_rows: Literal["error", "skip"] = Field(
        default="error",
        description="local_files: rows that fail the load-time check (invalid JSON, a missing or "
        "empty question or solution, no gold answer its answer format can read, one question "
        "with two gold answers). error: stop before the run and list them by file:line or "
        "row; skip: drop them with a warning.",
    )

    @model_validator(mode="after")
    def _check(self) -> TaskConfig:
        if self.min_steps > self.max_steps:
            raise ValueError(
                f"task.min_steps ({self.min_steps}) must be <= task.max_steps ({self.max_steps})"
            )
        if not self.operators or set(self.operators) - set("+-*"):
            raise ValueError(f"task.operators must be a subset of '+-*' (got {self.operators!r})")
        if self.name == "local_files" and not self.path:
            raise ValueError("task.path is required when task.name is 'local_files'")
        if self.answer_format != AUTO:
            ANSWER_FORMATS.check(self.answer_format)
        if self.data_format != AUTO:
            DATA_FORMATS.check(self.data_format)
        own = _OWN_FORMATS.get(self.name)
        if own is not None and self.answer_format not in (AUTO, own):
            raise ValueError(
                f"task {self.name} states answers in the {own!r} format "
                f"({ANSWER_FORMATS[own].description}): set task.answer_format: auto or {own} "
                f"(got {self.answer_format!r}); local_files reads either format"
            )
        return self


def make_task(cfg: TaskConfig) -> Task:
    """The task `cfg` names, with its knobs applied."""
    if cfg.name == "arith":
        return ArithTask(
            cfg.min_steps,
            cfg.max_steps,
            cfg.operand_max,
            cfg.operators,
            cfg.test_fraction,
            distinct_test=cfg.distinct_test,
        )
    if cfg.name == "math_style":
        return MathStyleTask(tuple(cfg.math_kinds), cfg.math_max, cfg.test_fraction)
    if cfg.name == "reasoning_gym":
        return ReasoningGymTask(cfg.rg_task, cfg.rg_kwargs, cfg.test_fraction)
    from grpo_core.data.tasks.local_files import LocalFilesTask

    assert cfg.path is not None
    return LocalFilesTask(
        cfg.path,
        cfg.test_path,
        cfg.test_fraction,
        cfg.on_bad_rows,
        cfg.answer_format,
        cfg.data_format,
        cfg.columns.model_dump(),
        cfg.file_reader,
    )
