"""Data formats of local problem data by name (`task.local_files.data_format`): which columns
hold the question, the worked solution and the final answer, and the answer format the data
states answers in; `auto` recognises a format by the data's columns. Torch-free: the config
lists the names."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Any

from grpo_core.contracts.registry import Registry

AUTO = "auto"
ROLES = ("question", "solution", "answer")


def with_auto(names: Callable[[], list[str]]) -> Callable[[dict[str, Any]], None]:
    """Pydantic `json_schema_extra`: `auto` and a registry's names as the field's choices."""

    def extra(schema: dict[str, Any]) -> None:
        schema["enum"] = [AUTO, *names()]

    return extra


@dataclass(frozen=True)
class Columns:
    """Which column holds each part of a problem. `answer` (the final answer alone) may be
    None: the gold answer is then read from the solution; `solution` may be None when an
    answer column gives the gold answer (there is then no gold solution to warm-start on).
    A dotted name (`reward_model.ground_truth`) reads a field of a struct column."""

    question: str
    solution: str | None
    answer: str | None

    def named(self) -> dict[str, str]:
        """role -> column, for the roles that have one."""
        return {role: name for role in ROLES if (name := getattr(self, role)) is not None}


@dataclass(frozen=True)
class DataFormat:
    """columns: the default column of each role. answer_format: how the data's answers are
    stated and judged (grpo_core/data/answer_formats.py), unless task.answer_format says.
    meta: columns kept as each problem's metadata when present. clean_solution: what a gold
    solution is trained on. required: a column `auto` chooses this format only with (a code
    problem without tests is no code problem)."""

    name: str
    description: str
    columns: Columns
    answer_format: str
    meta: tuple[str, ...] = ()
    clean_solution: Callable[[str], str] = str.strip
    required: str | None = None


DATA_FORMATS: Registry[DataFormat] = Registry("data format")

_CALCULATOR = re.compile(r"<<[^>]*>>")  # GSM8K's calculator annotations: <<48/2=24>>


def _without_calculator(solution: str) -> str:
    return _CALCULATOR.sub("", solution).strip()


DATA_FORMATS.add(
    "gsm8k",
    DataFormat(
        name="gsm8k",
        description="'question', and 'answer': a worked solution whose last line is "
        "'#### <number>'",
        columns=Columns(question="question", solution="answer", answer=None),
        answer_format="gsm8k",
        clean_solution=_without_calculator,
    ),
)
DATA_FORMATS.add(
    "math",
    DataFormat(
        name="math",
        description="'problem', 'solution' with the final answer in its last \\boxed{}, and "
        "an optional 'answer' column that is used instead when present ('level' and 'type' "
        "are kept as metadata)",
        columns=Columns(question="problem", solution="solution", answer="answer"),
        answer_format="boxed",
        meta=("level", "type"),
    ),
)

DATA_FORMATS.add(
    "code",
    DataFormat(
        name="code",
        description="'question', 'tests': assert statements a solution must pass (run in the "
        "Python tool's sandbox), and an optional 'solution': the program, in a ```python block",
        columns=Columns(question="question", solution="solution", answer="tests"),
        answer_format="python_tests",
        required="tests",
    ),
)


def has_column(columns: Collection[str], name: str) -> bool:
    """Whether data with top-level `columns` has column `name` (a dotted name: its struct)."""
    return name in columns or name.split(".", 1)[0] in columns


def resolve_columns(
    data_format: DataFormat, mapped: dict[str, str | None], columns: Collection[str]
) -> Columns:
    """The format's columns with the user's mapping (`task.local_files.columns`) applied. An
    unmapped optional role whose default column the data lacks has none: the answer column, or
    the solution when there is an answer column (a dataset of problems and final answers)."""
    chosen = replace(data_format.columns, **{r: n for r, n in mapped.items() if n is not None})
    if mapped.get("answer") is None and chosen.answer and not has_column(columns, chosen.answer):
        chosen = replace(chosen, answer=None)
    if (
        mapped.get("solution") is None
        and chosen.solution
        and chosen.answer is not None
        and not has_column(columns, chosen.solution)
    ):
        chosen = replace(chosen, solution=None)
    return chosen


def recognise(columns: Collection[str], mapped: dict[str, str | None]) -> DataFormat | str:
    """The data format whose columns (with the user's mapping) the data has most of, else
    why none can be chosen. Data without columns (no rows) gets the first format, so that its
    emptiness is what is reported."""
    if not columns:
        return DATA_FORMATS[DATA_FORMATS.names()[0]]
    scores: dict[str, int] = {}
    for name, data_format in DATA_FORMATS.items():
        if data_format.required and not has_column(columns, data_format.required):
            continue
        named = resolve_columns(data_format, mapped, columns).named().values()
        scores[name] = sum(has_column(columns, column) for column in set(named))
    best = max(scores.values())
    winners = [name for name, score in scores.items() if score == best]
    if best > 0 and len(winners) == 1:
        return DATA_FORMATS[winners[0]]
    formats = "; ".join(f"{name}: {f.description}" for name, f in DATA_FORMATS.items())
    return (
        f"cannot tell the data format from its columns {sorted(columns)}: set "
        f"task.local_files.data_format ({formats}) and name your columns with "
        "task.local_files.columns.question / .solution / .answer"
    )
