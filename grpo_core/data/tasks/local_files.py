"""Problems from local data, checked on load: GSM8K- or MATH-format JSON lines, JSON or parquet
files, and data written by `datasets` (a `save_to_disk` folder, a folder of data files, or a
file read with it), with a column mapping and the data's own train/test splits.

Reading is data_reading.py's, the row rules are row_checks.py's, the formats and their
columns data_formats.py's. Checking happens when the task is built, so `make_task(cfg.task)`
is a complete check of the rows themselves before any stage runs: `on_bad_rows="refuse"`
raises `TaskDataError` listing the first few bad rows; `"drop"` drops them with one warning.
Errors that make the rest of the data unreadable (a broken JSON array, gzip or parquet file,
a missing column) and data with no valid rows are refused either way. Rows too long for the
policy or the reward models are found by the pre-flight (flows/preflight_rows.py), which reads
every row of the task (`every_problem`) and leaves out those it drops (`without`).

Splits: `test_path` when given; else the data's own `test` split (a DatasetDict's, or a
folder of data files named by split); else a hash split of the questions by
`test_fraction`.
"""

from __future__ import annotations

import copy
import logging
import random
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from grpo_core.contracts.paths import LocalPath
from grpo_core.data.answer_formats import ANSWER_FORMATS, AnswerFormat
from grpo_core.data.tasks.base import (
    OnBadRows,
    Problem,
    Split,
    TaskCommon,
    TaskDataError,
    TaskSpec,
)
from grpo_core.data.tasks.data_formats import (
    AUTO,
    DATA_FORMATS,
    Columns,
    DataFormat,
    has_column,
    recognise,
    resolve_columns,
    with_auto,
)
from grpo_core.data.tasks.data_reading import BadRow, FileReader, RawData, read_data
from grpo_core.data.tasks.row_checks import (
    EARLIER_ON_BAD_ROWS,
    GoldRow,
    check_row,
    drop_duplicates,
    report_bad_rows,
)
from grpo_core.data.tasks.splits import split_of

log = logging.getLogger(__name__)
ColumnMap = dict[str, str | None]


@dataclass(frozen=True)
class Layout:
    """How the data is read: its data format, the column of each role, the answer format."""

    data_format: DataFormat
    columns: Columns
    answer_format: AnswerFormat


def layout_of(raw: RawData, data_format: str, columns: ColumnMap, answer_format: str) -> Layout:
    """The layout of `raw`: the named data format or the one its columns show (`auto`), the
    user's column mapping over the format's columns, and the answer format (`auto`: the data
    format's). A mapped column the data lacks is an error naming the field and its columns."""
    _check_mapped(raw, columns)
    if data_format == AUTO:
        found = recognise(raw.columns, columns)
        if isinstance(found, str):
            raise TaskDataError(f"{raw.origin}: {found}")
        chosen = found
    else:
        chosen = DATA_FORMATS[data_format]
    name = chosen.answer_format if answer_format == AUTO else answer_format
    return Layout(chosen, resolve_columns(chosen, columns, raw.columns), ANSWER_FORMATS[name])


def _check_mapped(raw: RawData, mapped: ColumnMap) -> None:
    """Each column the user mapped is in the data (data without rows is reported as such)."""
    for role, name in mapped.items():
        if name is not None and raw.columns and not has_column(raw.columns, name):
            raise TaskDataError(
                f"task.local_files.columns.{role} is {name!r}, which is not a column of "
                f"{raw.origin} (it has {raw.columns}): set it to one of them"
            )


def _check_table_columns(raw: RawData, layout: Layout) -> None:
    """A table has the columns every row needs (JSON rows name what they lack row by row)."""
    cols = layout.columns
    needed = [cols.question, *[c for c in (cols.solution, cols.answer) if c][:1]]
    missing = [c for c in needed if not has_column(raw.columns, c)]
    if raw.is_table and missing:
        raise TaskDataError(
            f"{raw.origin} lacks columns {missing} (has {raw.columns}); the "
            f"{layout.data_format.name} format reads {sorted(cols.named().values())}: name "
            "yours with task.local_files.columns.question / .solution / .answer, or set "
            "task.local_files.data_format"
        )


def check_rows(raw: RawData, layout: Layout, on_bad_rows: OnBadRows = "refuse") -> list[GoldRow]:
    """Valid, de-duplicated problems of one split of the data (see row_checks.py)."""
    _check_table_columns(raw, layout)
    wanted = [*layout.columns.named().values(), *layout.data_format.meta]
    selected = list(dict.fromkeys(c.split(".", 1)[0] for c in wanted))
    records, bad = raw.rows([c for c in selected if c in raw.columns])
    total = len(records) + len(bad)
    rows: list[GoldRow] = []
    for source, value in records:
        checked = check_row(
            value, source, layout.columns, layout.answer_format, layout.data_format.meta
        )
        if isinstance(checked, str):
            bad.append(BadRow(source, checked))
        else:
            rows.append(checked)
    rows, conflicts, exact = drop_duplicates(rows)
    bad = sorted(bad + conflicts, key=lambda b: b.source.number)
    if bad:
        report_bad_rows(raw.origin, bad, total, on_bad_rows)
    if exact:
        log.info(
            "%s: %d exact duplicate row(s) (same question and answer) kept once", raw.origin, exact
        )
    if not rows:
        dropped = f" ({sum(b.rows for b in bad)} bad rows dropped)" if bad else ""
        raise TaskDataError(f"{raw.origin}: no valid rows{dropped}; local_files needs at least one")
    return rows


def load_rows(
    path: str | Path,
    on_bad_rows: OnBadRows = "refuse",
    answer_format: str = AUTO,
    data_format: str = AUTO,
    columns: ColumnMap | None = None,
    file_reader: FileReader = "itergrpo",
) -> list[GoldRow]:
    """Valid problems of one file or dataset (a DatasetDict: its train split)."""
    splits = read_data(Path(path), file_reader, "task.local_files.path")
    raw = _one_split(splits, Path(path), "task.local_files.path", "train")
    layout = layout_of(raw, data_format, columns or {}, answer_format)
    return check_rows(raw, layout, on_bad_rows)


def _one_split(splits: dict[str | None, RawData], path: Path, field: str, split: str) -> RawData:
    """The data of a single-split path; of a DatasetDict, its split `split`."""
    if None in splits:
        return splits[None]
    if split not in splits:
        raise TaskDataError(
            f"{field} {path} has splits {sorted(str(s) for s in splits)} and no '{split}' "
            f"split: point {field} at the one to use (a save_to_disk DatasetDict keeps each "
            "split in its own folder, DIR/<split>)"
        )
    return splits[split]


def _train_and_test(
    path: Path, test_path: str | Path | None, file_reader: FileReader
) -> tuple[RawData, RawData | None]:
    """The training data, and the test data when there is any: `test_path`'s, else the data's
    own `test` split, else None (a hash split). Other splits are not used (logged)."""
    splits = read_data(path, file_reader, "task.local_files.path")
    train = _one_split(splits, path, "task.local_files.path", "train")
    unused = {str(s) for s in splits if s not in (None, "train", "test")}
    if test_path is not None and "test" in splits:
        unused.add("test (task.local_files.test_path is the test split)")
    if unused:
        log.info("%s: splits not used: %s", path, ", ".join(sorted(unused)))
    if test_path is not None:
        test_splits = read_data(Path(test_path), file_reader, "task.local_files.test_path")
        return train, _one_split(test_splits, Path(test_path), "task.local_files.test_path", "test")
    return train, splits.get("test")


class LocalFilesTask:
    """Problems from `path`: its train split, and for test `test_path`, the data's own test
    split or a hash split of `path` (see the module docstring)."""

    def __init__(
        self,
        path: str | Path,
        test_path: str | Path | None = None,
        test_fraction: float = 0.2,
        on_bad_rows: OnBadRows = "refuse",
        answer_format: str = AUTO,
        data_format: str = AUTO,
        columns: ColumnMap | None = None,
        file_reader: FileReader = "itergrpo",
    ) -> None:
        self.name = f"local_files/{Path(path).name}"
        self.on_bad_rows: OnBadRows = on_bad_rows
        self._left_out: frozenset[str] = frozenset()
        mapped = columns or {}
        train_raw, test_raw = _train_and_test(Path(path), test_path, file_reader)
        layout = layout_of(train_raw, data_format, mapped, answer_format)
        self.data_format, self.answer_format = layout.data_format, layout.answer_format
        log.info(
            "%s: %s format, columns %s, answers judged as %s",
            self.name,
            layout.data_format.name,
            layout.columns.named(),
            layout.answer_format.name,
        )
        rows = check_rows(train_raw, layout, on_bad_rows)
        if test_raw is None:
            self._rows: dict[Split, list[GoldRow]] = {
                s: [r for r in rows if split_of(r.question, test_fraction) == s]
                for s in ("train", "test")
            }
            return
        test_layout = layout_of(test_raw, layout.data_format.name, mapped, answer_format)
        test = check_rows(test_raw, test_layout, on_bad_rows)
        seen = {r.question.strip() for r in rows}
        shared = sum(r.question.strip() in seen for r in test)
        if shared:
            log.warning(
                "%s: %d of %d test questions are also training questions",
                self.name,
                shared,
                len(test),
            )
        self._rows = {"train": rows, "test": test}

    def problems(self, split: Split, n: int, seed: int) -> list[Problem]:
        """`n` problems of `split` in a seeded order (all of them, with a warning, if fewer)."""
        rows = self._rows[split]
        order = list(range(len(rows)))
        random.Random(f"local/{split}/{seed}").shuffle(order)
        # Rows left out are skipped in the same order: the others keep their places and ids.
        kept = (
            [i for i in order if self._id(split, i) not in self._left_out]
            if self._left_out
            else order
        )
        if n > len(kept):
            log.warning("%s has %d %s problems; %d requested", self.name, len(kept), split, n)
        return [self._problem(split, i, rows[i]) for i in kept[:n]]

    def every_problem(self, split: Split) -> list[Problem]:
        return [
            self._problem(split, i, row)
            for i, row in enumerate(self._rows[split])
            if self._id(split, i) not in self._left_out
        ]

    def row_of(self, problem: Problem) -> str:
        for split, rows in self._rows.items():
            index = problem.problem_id.removeprefix(f"{self.name}-{split}-")
            if index != problem.problem_id:
                return str(rows[int(index)].source)
        raise ValueError(f"{problem.problem_id!r} is not a problem of {self.name}")

    def without(self, problem_ids: Collection[str]) -> LocalFilesTask:
        fewer = copy.copy(self)
        fewer._left_out = self._left_out | frozenset(problem_ids)
        return fewer

    def _id(self, split: Split, index: int) -> str:
        return f"{self.name}-{split}-{index}"

    def _problem(self, split: Split, index: int, row: GoldRow) -> Problem:
        solution = row.solution
        return Problem(
            problem_id=self._id(split, index),
            question=row.question,
            answer=row.answer,
            solution=None if solution is None else self.data_format.clean_solution(solution),
            meta=dict(row.meta),
        )

    def is_correct(self, problem: Problem, completion: str) -> bool:
        return self.answer_format.is_correct(problem.answer, completion)

    def step_labels(self, problem: Problem, completion: str) -> list[bool] | None:
        return None


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


class LocalFilesSettings(BaseModel):
    """The local_files task's knobs: where the data is, how it is read and checked."""

    model_config = ConfigDict(extra="forbid")

    path: LocalPath = Field(
        default=None,
        description="A .jsonl/.json(.gz)/.parquet file, or a folder written by datasets' "
        "save_to_disk (a Dataset, or a DatasetDict whose train/test splits are used) or "
        "holding data files that datasets.load_dataset reads (splits by file name). Required "
        "when task.name is local_files. Relative: to the current directory; stored absolute, "
        "with a fingerprint of the data that a resume checks.",
    )
    test_path: LocalPath = Field(
        default=None,
        description="Optional test data (a file or folder); else the data's own test split, "
        "else a hash split of path by task.test_fraction. Stored absolute and fingerprinted, "
        "as path.",
    )
    data_format: str = Field(
        default=AUTO,
        description="The data's format, which gives its default columns and answer format: "
        + "; ".join(f"{name}: {f.description}" for name, f in DATA_FORMATS.items())
        + ". auto: the format whose columns the data has.",
        json_schema_extra=with_auto(DATA_FORMATS.names),
    )
    columns: TaskColumns = Field(
        default_factory=TaskColumns,
        description="The column of each part of a problem, where the data names them "
        "otherwise than its format (task.local_files.columns.question: prompt).",
    )
    file_reader: FileReader = Field(
        default="itergrpo",
        description="Who reads a file. itergrpo: .jsonl/.json(.gz)/.parquet, bad rows named "
        "FILE:LINE; datasets: datasets.load_dataset (also .csv, .arrow), rows named FILE row "
        "N. Folders are always read with datasets.",
    )
    on_bad_rows: OnBadRows = Field(
        default="refuse",
        description="Rows the run cannot use: those that fail the load-time check (invalid "
        "JSON, a missing or empty question or solution, no gold answer its answer format can "
        "read, one question with two gold answers) and, at pre-flight, those whose prompt plus "
        "the largest max_new_tokens exceeds the policy's context or reward_models.max_length. "
        "refuse: stop before the run and name them; drop: leave them out, with a warning, and "
        "count them in the run's status.json (rows_dropped). error and skip, their earlier "
        "names, are read as refuse and drop.",
    )

    @field_validator("data_format")
    @classmethod
    def _known_format(cls, name: str) -> str:
        return name if name == AUTO else DATA_FORMATS.check(name)


def build(settings: LocalFilesSettings, common: TaskCommon) -> LocalFilesTask:
    assert settings.path is not None  # the task's `needs`, checked with the config
    return LocalFilesTask(
        settings.path,
        settings.test_path,
        common.test_fraction,
        settings.on_bad_rows,
        common.answer_format,
        settings.data_format,
        settings.columns.model_dump(),
        settings.file_reader,
    )


TASK = TaskSpec(
    name="local_files",
    settings=LocalFilesSettings,
    build=build,
    summary="GSM8K- or MATH-format data on local disk (jsonl/json/parquet files or a "
    "datasets folder; docs/data.md)",
    needs=("path",),
    data_paths=("path", "test_path"),
    earlier_keys={k: k for k in LocalFilesSettings.model_fields},
    earlier_values={"on_bad_rows": EARLIER_ON_BAD_ROWS},
)
