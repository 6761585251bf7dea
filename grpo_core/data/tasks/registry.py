"""Build a task from its config: `make_task(TaskConfig(name="arith", ...))`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from grpo_core.data.answer_formats import ANSWER_FORMATS
from grpo_core.data.tasks.arith import ArithTask
from grpo_core.data.tasks.base import Task
from grpo_core.data.tasks.math_style import KINDS, MathKind, MathStyleTask
from grpo_core.data.tasks.reasoning_gym import ReasoningGymTask

# The answer format each generated task writes its gold answers in (local_files: the config's).
_OWN_FORMATS = {
    "arith": ArithTask.answer_format.name,
    "reasoning_gym": ReasoningGymTask.answer_format.name,
    "math_style": MathStyleTask.answer_format.name,
}


class TaskConfig(BaseModel):
    """Which task to train and evaluate on, and its difficulty knobs."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: Literal["arith", "math_style", "reasoning_gym", "local_files"] = Field(
        default="arith",
        description="arith: built-in arithmetic chains; math_style: built-in fraction sums, "
        "radical sums and midpoints with \\boxed{} LaTeX answers; reasoning_gym: a "
        "reasoning-gym dataset (needs itergrpo[real]); local_files: GSM8K-format jsonl/parquet "
        "on local disk.",
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
        default=None, description="local_files: jsonl/parquet file with question/answer columns."
    )
    test_path: str | None = Field(
        default=None,
        description="local_files: optional separate test file; else a hash split of path.",
    )
    answer_format: str = Field(
        default="gsm8k",
        description="How outputs state their final answer and how it is judged "
        "(grpo_core/data/answer_formats.py): 'gsm8k' (a last line '#### <answer>', compared as "
        "numbers) or 'boxed' (the last \\boxed{...}, compared by math-verify: 1/2 = 0.5 = "
        "\\frac12). arith and reasoning_gym state answers as gsm8k; local_files may be either "
        "(boxed: the gold answer is the answer column's last \\boxed{}, or the whole answer).",
        json_schema_extra=ANSWER_FORMATS.json_schema,
    )
    on_bad_rows: Literal["error", "skip"] = Field(
        default="error",
        description="local_files: rows that fail the load-time check (invalid JSON, missing or "
        "empty question/answer, no numeric '#### <answer>', one question with two gold answers). "
        "error: stop before the run and list them by file:line; skip: drop them with a warning.",
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
        ANSWER_FORMATS.check(self.answer_format)
        own = _OWN_FORMATS.get(self.name)
        if own is not None and "answer_format" not in self.model_fields_set:
            self.answer_format = own  # a generated task's own format, unless one is chosen
        if own is not None and self.answer_format != own:
            raise ValueError(
                f"task {self.name} states answers in the {own!r} format "
                f"({ANSWER_FORMATS[own].description}): set task.answer_format: {own} or leave "
                f"it out (got {self.answer_format!r}); local_files reads either format"
            )
        return self


def make_task(cfg: TaskConfig) -> Task:
    """The task `cfg` names, with its knobs applied."""
    if cfg.name == "arith":
        return ArithTask(
            cfg.min_steps, cfg.max_steps, cfg.operand_max, cfg.operators, cfg.test_fraction
        )
    if cfg.name == "math_style":
        return MathStyleTask(tuple(cfg.math_kinds), cfg.math_max, cfg.test_fraction)
    if cfg.name == "reasoning_gym":
        return ReasoningGymTask(cfg.rg_task, cfg.rg_kwargs, cfg.test_fraction)
    from grpo_core.data.tasks.local_files import LocalFilesTask

    assert cfg.path is not None
    return LocalFilesTask(
        cfg.path, cfg.test_path, cfg.test_fraction, cfg.on_bad_rows, cfg.answer_format
    )
