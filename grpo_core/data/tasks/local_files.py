"""GSM8K-format problems from local files (`question`, `answer` ending `#### x`), checked on load.

Formats: `.jsonl`/`.jsonl.gz` (one object per line), `.json`/`.json.gz` (a JSON array of
objects, or one object per line) and `.parquet`. Files are read here rather than through
`datasets`, so every bad row is named as `FILE:LINE` (1-based) or, for parquet, `FILE row N`
(0-based). Checking happens when the task is built, so `make_task(cfg.task)` is a complete
pre-flight check of the data before any stage runs.

A row is bad when it is not a JSON object, is invalid JSON or not UTF-8, lacks a string
`question` or `answer` (missing, null or another type), has a blank question, or its answer
has no `#### <answer>` line whose answer is a number. Gold answers are stored normalised
(`#### 1,234` -> `1234`, `$5` -> `5`); `#### 42 apples` is refused because the verifier compares
numbers and would never match it. The same question (whitespace-stripped) with different gold
answers is bad in all its copies. Exact duplicates (same question, same gold answer) are kept
once, the first, and counted in an INFO log line.

`on_bad_rows="error"` raises `TaskDataError` listing the first few bad rows; `"skip"` drops
them with one warning. Errors that make the rest of a file unreadable (a broken JSON array,
a broken gzip or parquet file, missing parquet columns) and a file with no valid rows are
refused either way.
"""

from __future__ import annotations

import codecs
import gzip
import json
import logging
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from grpo_core.contracts.errors import MissingPathError
from grpo_core.data.answer_formats import ANSWER_FORMATS, AnswerFormat, last_boxed
from grpo_core.data.answers import extract_answer, normalize_number
from grpo_core.data.tasks.base import Problem, Split, TaskDataError
from grpo_core.data.tasks.splits import split_of

log = logging.getLogger(__name__)
GSM8K = ANSWER_FORMATS["gsm8k"]
OnBadRows = Literal["error", "skip"]
_CALCULATOR = re.compile(r"<<[^>]*>>")
_CANONICAL_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")  # what normalize_number makes of a number
_SHOWN = 5  # bad rows named in an error or warning
_FIX = "fix or remove {these}, or set task.on_bad_rows: skip to drop {them}"


@dataclass(frozen=True)
class RowSource:
    """Where a row came from, so messages can point at it: a line (1-based) or a parquet row."""

    path: Path
    number: int
    unit: Literal["line", "row"]

    def __str__(self) -> str:
        if self.unit == "line":
            return f"{self.path}:{self.number}"
        return f"{self.path} row {self.number}"

    @property
    def short(self) -> str:
        """`line 7` / `row 7`, for naming a second row of the same file."""
        return f"{self.unit} {self.number}"


@dataclass(frozen=True)
class GoldRow:
    """A valid problem: raw question, GSM8K solution text and normalised numeric gold answer."""

    question: str
    solution: str
    answer: str
    source: RowSource


@dataclass(frozen=True)
class BadRow:
    """A problem found in the data; `rows` is how many rows it covers (a conflict: all copies)."""

    source: RowSource
    problem: str
    rows: int = 1


def _json_kind(value: object) -> str:
    """JSON's name for the type of `value`, for messages about rows."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


def _short(text: str, limit: int = 40) -> str:
    """`text` quoted and cut to `limit` characters, so one long field cannot flood a message."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def check_row(value: object, answer_format: AnswerFormat = GSM8K) -> tuple[str, str, str] | str:
    """(question, answer text, gold answer) of a usable row, else what is wrong with it. With
    the `boxed` format the gold answer is the answer's last `\\boxed{}`, or the whole answer."""
    if not isinstance(value, dict):
        return f"not a JSON object (got {_json_kind(value)})"
    for key in ("question", "answer"):
        if key not in value:
            return f"missing '{key}'"
        if value[key] is None:
            return f"'{key}' is null"
        if not isinstance(value[key], str):
            return f"'{key}' must be a string (got {_json_kind(value[key])})"
    question, answer = value["question"], value["answer"]
    if not question.strip():
        return "'question' is empty"
    if answer_format is not GSM8K:
        gold = last_boxed(answer) or answer.strip()
        if not gold:
            return "'answer' is empty"
        problem = answer_format.check_gold(gold)
        return f"gold answer {_short(gold)}: {problem}" if problem else (question, answer, gold)
    if "####" not in answer:
        return "answer has no '#### <answer>' line"
    gold = extract_answer(answer)
    if gold is None:
        return "nothing after '####' in answer"
    number = normalize_number(gold)
    if not _CANONICAL_NUMBER.match(number):
        return f"gold answer after '####' must be a number (got {_short(gold)})"
    return question, answer, number


Records = tuple[list[tuple[RowSource, object]], list[BadRow]]


def _read_lines(path: Path, data: bytes) -> Records:
    """One JSON value per line; undecodable or unparsable lines become bad rows, not errors."""
    records: list[tuple[RowSource, object]] = []
    bad: list[BadRow] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        source = RowSource(path, number, "line")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            problem = f"not valid UTF-8 (byte 0x{raw[err.start]:02x} at column {err.start + 1})"
            bad.append(BadRow(source, problem))
            continue
        if not text.strip():
            continue
        try:
            records.append((source, json.loads(text)))
        except json.JSONDecodeError as err:
            bad.append(BadRow(source, f"invalid JSON: {err.msg} (column {err.colno})"))
    return records, bad


def _skip_whitespace(text: str, pos: int) -> int:
    """Index of the first non-whitespace character of `text` at or after `pos`."""
    while pos < len(text) and text[pos] in " \t\n\r":
        pos += 1
    return pos


def _read_array(path: Path, text: str) -> list[tuple[RowSource, object]]:
    """Elements of a top-level JSON array, each with the line it starts on.

    Parsed element by element (`raw_decode`) to know those lines; invalid JSON here is an
    error for the whole file, since nothing after it can be trusted.
    """
    decoder = json.JSONDecoder()
    records: list[tuple[RowSource, object]] = []
    pos = _skip_whitespace(text, _skip_whitespace(text, 0) + 1)  # just past the '['
    line, counted_to = 1, 0
    try:
        while not text.startswith("]", pos):
            value, end = decoder.raw_decode(text, pos)
            line, counted_to = line + text.count("\n", counted_to, pos), pos
            records.append((RowSource(path, line, "line"), value))
            pos = _skip_whitespace(text, end)
            if text.startswith(",", pos):
                pos = _skip_whitespace(text, pos + 1)
                if text.startswith("]", pos):
                    raise json.JSONDecodeError("Expecting value (trailing comma)", text, pos)
            elif not text.startswith("]", pos):
                raise json.JSONDecodeError("Expecting ',' or ']'", text, pos)
        pos = _skip_whitespace(text, pos + 1)  # past the closing ']'
        if pos < len(text):
            raise json.JSONDecodeError("Extra data after the array", text, pos)
    except json.JSONDecodeError as err:
        raise TaskDataError(
            f"{path}:{err.lineno}: invalid JSON: {err.msg} (column {err.colno}); "
            "a JSON array cannot be read past it, so fix the file"
        ) from err
    return records


def _read_json(path: Path, data: bytes, as_array_if_bracketed: bool) -> Records:
    """Records of a JSON-lines file, or of a `.json` file holding one JSON array."""
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    if not (as_array_if_bracketed and data.lstrip(b" \t\n\r").startswith(b"[")):
        return _read_lines(path, data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise TaskDataError(
            f"{path}:{line}: not valid UTF-8 (byte 0x{data[err.start]:02x}); save the file as UTF-8"
        ) from err
    return _read_array(path, text), []


def _read_parquet(path: Path) -> Records:
    """`question`/`answer` of each parquet row; a missing column is an error for the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as err:
        raise TaskDataError(f"{path}: cannot read as parquet: {err}") from err
    missing = {"question", "answer"} - set(table.column_names)
    if missing:
        raise TaskDataError(
            f"{path} lacks columns {sorted(missing)} (has {table.column_names}); "
            "local_files needs 'question' and 'answer'"
        )
    rows = table.select(["question", "answer"]).to_pylist()
    return [(RowSource(path, i, "row"), row) for i, row in enumerate(rows)], []


def _read_records(path: Path) -> Records:
    """Raw records of `path` by its suffix, with the rows that could not even be parsed."""
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    if suffix == ".parquet":
        return _read_parquet(path)
    if suffix not in (".jsonl", ".json", ".jsonl.gz", ".json.gz"):
        raise TaskDataError(
            f"local_files path must end in .jsonl, .json, .jsonl.gz, .json.gz or .parquet "
            f"(got {path})"
        )
    try:
        data = gzip.decompress(path.read_bytes()) if suffix.endswith(".gz") else path.read_bytes()
    except (gzip.BadGzipFile, EOFError) as err:
        raise TaskDataError(f"{path}: not a valid gzip file ({err})") from err
    return _read_json(path, data, as_array_if_bracketed=suffix in (".json", ".json.gz"))


def _drop_duplicates(rows: list[GoldRow]) -> tuple[list[GoldRow], list[BadRow], int]:
    """First copy of each question; questions with different gold answers become bad rows.

    Returns (rows kept, conflicts, exact duplicates dropped).
    """
    groups: dict[str, list[GoldRow]] = {}
    for row in rows:
        groups.setdefault(row.question.strip(), []).append(row)
    kept: list[GoldRow] = []
    conflicts: list[BadRow] = []
    exact = 0
    for group in groups.values():
        if len({row.answer for row in group}) == 1:
            kept.append(group[0])
            exact += len(group) - 1
            continue
        others = ", ".join(f"{row.source.short} says {row.answer}" for row in group)
        conflicts.append(
            BadRow(
                group[0].source,
                f"same question with different gold answers ({others})",
                rows=len(group),
            )
        )
    return kept, conflicts, exact


def _report_bad_rows(path: Path, bad: list[BadRow], total: int, on_bad_rows: OnBadRows) -> None:
    """Raise `TaskDataError` naming the first few bad rows, or (skip) warn once about them."""
    count = sum(b.rows for b in bad)
    listed = [f"{b.source}: {b.problem}" for b in bad[:_SHOWN]]
    if len(bad) > _SHOWN:
        listed.append(f"... and {len(bad) - _SHOWN} more")
    if on_bad_rows == "skip":
        log.warning(
            "%s: dropped %d bad row(s) of %d (task.on_bad_rows: skip): %s",
            path,
            count,
            total,
            "; ".join(listed),
        )
        return
    if len(bad) == 1:
        these = "this row" if count == 1 else "these rows"
        them = "it" if count == 1 else "them"
        raise TaskDataError(f"{listed[0]}; {_FIX.format(these=these, them=them)}")
    raise TaskDataError(
        f"{path}: {count} bad rows of {total}; {_FIX.format(these='these rows', them='them')}:\n  "
        + "\n  ".join(listed)
    )


def load_rows(
    path: str | Path, on_bad_rows: OnBadRows = "error", answer_format: AnswerFormat = GSM8K
) -> list[GoldRow]:
    """Valid, de-duplicated problems of a local file (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise MissingPathError(f"local_files path does not exist: {path}: fix task.path")
    records, bad = _read_records(path)
    total = len(records) + len(bad)
    rows: list[GoldRow] = []
    for source, value in records:
        checked = check_row(value, answer_format)
        if isinstance(checked, str):
            bad.append(BadRow(source, checked))
        else:
            rows.append(GoldRow(*checked, source=source))
    rows, conflicts, exact = _drop_duplicates(rows)
    bad = sorted(bad + conflicts, key=lambda b: b.source.number)
    if bad:
        _report_bad_rows(path, bad, total, on_bad_rows)
    if exact:
        log.info("%s: %d exact duplicate row(s) (same question and answer) kept once", path, exact)
    if not rows:
        dropped = f" ({sum(b.rows for b in bad)} bad rows dropped)" if bad else ""
        raise TaskDataError(f"{path}: no valid rows{dropped}; local_files needs at least one")
    return rows


class LocalFilesTask:
    """Problems from `path` (and `test_path` if given; else a hash split of `path`)."""

    def __init__(
        self,
        path: str | Path,
        test_path: str | Path | None = None,
        test_fraction: float = 0.2,
        on_bad_rows: OnBadRows = "error",
        answer_format: str = "gsm8k",
    ) -> None:
        self.name = f"local_files/{Path(path).name}"
        self.answer_format = ANSWER_FORMATS[answer_format]
        rows = load_rows(path, on_bad_rows, self.answer_format)
        if test_path is None:
            self._rows: dict[Split, list[GoldRow]] = {
                s: [r for r in rows if split_of(r.question, test_fraction) == s]
                for s in ("train", "test")
            }
        else:
            test = load_rows(test_path, on_bad_rows, self.answer_format)
            self._rows = {"train": rows, "test": test}

    def problems(self, split: Split, n: int, seed: int) -> list[Problem]:
        """`n` problems of `split` in a seeded order (all of them, with a warning, if fewer)."""
        rows = self._rows[split]
        if n > len(rows):
            log.warning("%s has %d %s problems; %d requested", self.name, len(rows), split, n)
        order = list(range(len(rows)))
        random.Random(f"local/{split}/{seed}").shuffle(order)
        return [
            Problem(
                problem_id=f"{self.name}-{split}-{i}",
                question=rows[i].question,
                answer=rows[i].answer,
                solution=_CALCULATOR.sub("", rows[i].solution).strip(),
            )
            for i in order[:n]
        ]

    def is_correct(self, problem: Problem, completion: str) -> bool:
        return self.answer_format.is_correct(problem.answer, completion)

    def step_labels(self, problem: Problem, completion: str) -> list[bool] | None:
        return None
