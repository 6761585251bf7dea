"""Checking raw rows of local problem data: each row gives a question and a gold answer the
task's answer format can judge, or is a bad row that says what is wrong and where.

A row is bad when it is not an object, a question, solution or answer value is missing, null
or of another type, the question is blank, or no gold answer can be read: `gsm8k` needs a
`#### <number>` line in the solution (or a number in the answer column); other formats read
the answer column (its last `\\boxed{}`, else all of it) or else the solution's final answer
(its last `\\boxed{}`), and the format must be able to compare it (`check_gold`: math-verify
for `boxed`). Gold numbers are stored normalised (`#### 1,234` -> `1234`). The same question
(whitespace-stripped) with different gold answers is bad in all its copies; exact duplicates
are kept once.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

from grpo_core.data.answer_formats import AnswerFormat
from grpo_core.data.answers import extract_answer, normalize_number
from grpo_core.data.tasks.base import OnBadRows, TaskDataError
from grpo_core.data.tasks.data_formats import Columns
from grpo_core.data.tasks.data_reading import BadRow, RowSource

log = logging.getLogger("grpo_core.data.tasks.local_files")  # the task's log, as before the split
# Earlier names of the values, still read (stored configs of earlier runs hold them).
EARLIER_ON_BAD_ROWS = {"error": "refuse", "skip": "drop"}
_CANONICAL_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")  # what normalize_number makes of a number
_SHOWN = 5  # bad rows named in an error or warning
_FIX = "fix or remove {these}, or set task.local_files.on_bad_rows: drop to leave {them} out"
_MISSING = object()


@dataclass(frozen=True)
class GoldRow:
    """A valid problem: raw question, gold solution (None when the data has none), gold answer
    (a normalised number for gsm8k), and the metadata columns the data format keeps."""

    question: str
    solution: str | None
    answer: str
    source: RowSource
    meta: dict[str, str] = field(default_factory=dict)


class _Bad(Exception):
    """What is wrong with the row being checked."""


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


def _field(row: dict[str, object], name: str) -> object:
    """The value of column `name` (a dotted name: a field of a struct column), or _MISSING."""
    if name in row:
        return row[name]
    head, dot, rest = name.partition(".")
    inner = row.get(head)
    return _field(inner, rest) if dot and isinstance(inner, dict) else _MISSING


def _string(row: dict[str, object], name: str, required: bool, numbers: bool = False) -> str | None:
    """The text of column `name`; None when it is absent or null and not `required`."""
    value = _field(row, name)
    if value is _MISSING or value is None:
        if required:
            raise _Bad(f"missing '{name}'" if value is _MISSING else f"'{name}' is null")
        return None
    if numbers and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        kinds = "a string or a number" if numbers else "a string"
        raise _Bad(f"'{name}' must be {kinds} (got {_json_kind(value)})")
    return value


def _gsm8k_gold(solution: str | None, answer: str | None, columns: Columns) -> str:
    """The normalised gold number: the answer column's (after `####` if it has one), else the
    text after the solution's last `####`."""
    if answer is not None:
        gold = (extract_answer(answer) or "") if "####" in answer else answer.strip()
        where = f"in '{columns.answer}'"
    else:
        assert solution is not None and columns.solution is not None
        if "####" not in solution:
            raise _Bad(f"{columns.solution} has no '#### <answer>' line")
        gold = extract_answer(solution) or ""
        if not gold:
            raise _Bad(f"nothing after '####' in {columns.solution}")
        where = "after '####'"
    number = normalize_number(gold)
    if not _CANONICAL_NUMBER.match(number):
        raise _Bad(f"gold answer {where} must be a number (got {_short(gold)})")
    return number


def _format_gold(
    solution: str | None, answer: str | None, columns: Columns, answer_format: AnswerFormat
) -> str:
    """The gold answer in a format other than gsm8k: the answer column's final answer (or all
    of it), else the solution's; the format must be able to compare it."""
    if answer is not None:
        gold, origin = answer_format.extract(answer) or answer.strip(), f"'{columns.answer}'"
    else:
        assert solution is not None and columns.solution is not None
        found = answer_format.extract(solution)
        if found is None:
            other = (
                f"the row has no '{columns.answer}'"
                if columns.answer
                else "the data has no answer column (task.local_files.columns.answer)"
            )
            raise _Bad(
                f"'{columns.solution}' states no final answer ({answer_format.name}: "
                f"{answer_format.description}) and {other}"
            )
        gold, origin = found, f"'{columns.solution}'"
    problem = answer_format.check_gold(gold)
    if problem:
        raise _Bad(f"gold answer {_short(gold)}: {problem} (read from {origin})")
    return gold


def check_row(
    value: object,
    source: RowSource,
    columns: Columns,
    answer_format: AnswerFormat,
    meta: tuple[str, ...] = (),
) -> GoldRow | str:
    """The problem of the row read at `source`, else what is wrong with it."""
    if not isinstance(value, dict):
        return f"not a JSON object (got {_json_kind(value)})"
    try:
        question = _string(value, columns.question, required=True)
        assert question is not None
        solution = answer = None
        if columns.solution is not None:
            solution = _string(value, columns.solution, required=columns.answer is None)
        if columns.answer is not None:
            answer = _string(value, columns.answer, columns.solution is None, numbers=True)
            answer = answer if answer is None or answer.strip() else None
        if not question.strip():
            return f"'{columns.question}' is empty"
        if solution is None and answer is None:
            if columns.solution is None:
                return f"'{columns.answer}' is empty"
            return f"neither '{columns.solution}' nor '{columns.answer}' has a value"
        if answer_format.name == "gsm8k":
            gold = _gsm8k_gold(solution, answer, columns)
        else:
            gold = _format_gold(solution, answer, columns, answer_format)
    except _Bad as bad:
        return str(bad)
    kept = {c: str(v) for c in meta if (v := _field(value, c)) is not _MISSING and v is not None}
    return GoldRow(question, solution, gold, source, kept)


def drop_duplicates(rows: list[GoldRow]) -> tuple[list[GoldRow], list[BadRow], int]:
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


_REPORTED: set[str] = set()  # the skipped-rows warnings already given by this process


def report_bad_rows(origin: str, bad: list[BadRow], total: int, on_bad_rows: OnBadRows) -> None:
    """Raise `TaskDataError` naming the first few bad rows, or (drop) warn about them once
    per process."""
    count = sum(b.rows for b in bad)
    listed = [f"{b.source}: {b.problem}" for b in bad[:_SHOWN]]
    if len(bad) > _SHOWN:
        listed.append(f"... and {len(bad) - _SHOWN} more")
    if on_bad_rows == "drop":
        message = (
            f"{origin}: dropped {count} bad row(s) of {total} "
            "(task.local_files.on_bad_rows: drop): "
        )
        message += "; ".join(listed)
        # The pre-flight, the run and each stage build the task: say it once per process.
        if message not in _REPORTED:
            _REPORTED.add(message)
            log.warning("%s", message)
        return
    if len(bad) == 1:
        these = "this row" if count == 1 else "these rows"
        them = "it" if count == 1 else "them"
        raise TaskDataError(f"{listed[0]}; {_FIX.format(these=these, them=them)}")
    fix = _FIX.format(these="these rows", them="them")
    raise TaskDataError(f"{origin}: {count} bad rows of {total}; {fix}:\n  " + "\n  ".join(listed))
