"""Reading local problem data into raw rows, each with the place it came from.

JSON lines / JSON arrays (`.jsonl`, `.json`, `.gz`) and parquet are read here, so a bad row is
named `FILE:LINE` (1-based) or `FILE row N` (0-based); folders (a `save_to_disk` Dataset or
DatasetDict, or a folder of data files) and, on request, files are read with `datasets`, rows
named `FILE row N` (a DatasetDict's split as its folder, `DIR/train`). `datasets` and pyarrow
are imported only here and only when such data is read.
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
import json
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from grpo_core.contracts.errors import MissingPathError
from grpo_core.data.tasks.base import TaskDataError

FileReader = Literal["itergrpo", "datasets"]
_OWN_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".parquet")
_DATASETS_BUILDERS = {
    ".jsonl": "json",
    ".json": "json",
    ".jsonl.gz": "json",
    ".json.gz": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".arrow": "arrow",
}


@dataclass(frozen=True)
class RowSource:
    """Where a row came from, so messages can point at it: a line (1-based) or a row (0-based)."""

    origin: str
    number: int
    unit: Literal["line", "row"]

    def __str__(self) -> str:
        if self.unit == "line":
            return f"{self.origin}:{self.number}"
        return f"{self.origin} row {self.number}"

    @property
    def short(self) -> str:
        """`line 7` / `row 7`, for naming a second row of the same data."""
        return f"{self.unit} {self.number}"


@dataclass(frozen=True)
class BadRow:
    """A problem found in the data; `rows` is how many rows it covers (a conflict: all copies)."""

    source: RowSource
    problem: str
    rows: int = 1


Records = tuple[list[tuple[RowSource, object]], list[BadRow]]


@dataclass(frozen=True)
class RawData:
    """One split of the data as read: `columns` are a table's columns (`is_table`) or the
    keys JSON rows have; `rows(columns)` reads the rows (a table: only those columns), with
    the rows that could not even be parsed."""

    origin: str
    columns: list[str]
    is_table: bool
    rows: Callable[[list[str]], Records]


def _suffix(path: Path) -> str:
    return "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix


def read_data(path: Path, file_reader: FileReader, field: str) -> dict[str | None, RawData]:
    """The data at `path` by split name: a DatasetDict's splits, else one split named None.
    `field` is the config field that named the path, for the error when it does not exist."""
    if path.is_dir():
        return _read_with_datasets(path, None)
    if not path.is_file():
        raise MissingPathError(f"local_files path does not exist: {path}: fix {field}")
    suffix = _suffix(path)
    if file_reader == "datasets":
        if suffix not in _DATASETS_BUILDERS:
            raise TaskDataError(
                f"{field} read with datasets must end in {', '.join(_DATASETS_BUILDERS)} "
                f"(got {path})"
            )
        return _read_with_datasets(path, _DATASETS_BUILDERS[suffix])
    if suffix == ".parquet":
        return {None: _read_parquet(path)}
    if suffix not in _OWN_SUFFIXES:
        raise TaskDataError(
            f"local_files path must end in .jsonl, .json, .jsonl.gz, .json.gz or .parquet, or "
            f"be a datasets folder (got {path}); other files: "
            "task.local_files.file_reader: datasets"
        )
    try:
        data = gzip.decompress(path.read_bytes()) if suffix.endswith(".gz") else path.read_bytes()
    except (gzip.BadGzipFile, EOFError) as err:
        raise TaskDataError(f"{path}: not a valid gzip file ({err})") from err
    records, bad = _read_json(path, data, as_array_if_bracketed=suffix in (".json", ".json.gz"))
    keys = dict.fromkeys(k for _, value in records if isinstance(value, dict) for k in value)
    return {None: RawData(str(path), list(keys), False, lambda _: (records, bad))}


# ---- JSON lines and arrays --------------------------------------------------------------------


def _read_lines(path: Path, data: bytes) -> Records:
    """One JSON value per line; undecodable or unparsable lines become bad rows, not errors."""
    records: list[tuple[RowSource, object]] = []
    bad: list[BadRow] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        source = RowSource(str(path), number, "line")
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
            records.append((RowSource(str(path), line, "line"), value))
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


# ---- tables: parquet and datasets ------------------------------------------------------------


def _table_rows(origin: str, rows: list[dict[str, Any]]) -> Records:
    return [(RowSource(origin, i, "row"), row) for i, row in enumerate(rows)], []


def _read_parquet(path: Path) -> RawData:
    """A parquet file's columns; its rows are read only for the columns a task uses."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def rows(columns: list[str]) -> Records:
        try:
            table = pq.read_table(path, columns=columns)
        except (pa.ArrowException, OSError) as err:
            raise TaskDataError(f"{path}: cannot read as parquet: {err}") from err
        return _table_rows(str(path), table.to_pylist())

    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as err:
        raise TaskDataError(f"{path}: cannot read as parquet: {err}") from err
    return RawData(str(path), list(schema.names), True, rows)


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """No progress bars from `datasets` while it reads: the pre-flight output stays readable."""
    import datasets

    shown = not datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if shown:
            datasets.enable_progress_bars()


def _read_with_datasets(path: Path, builder: str | None) -> dict[str | None, RawData]:
    """A `save_to_disk` folder (load_from_disk), a folder of data files (load_dataset with
    the splits its file names give) or one file (`builder`: json, parquet...), by split."""
    import datasets
    import pyarrow as pa

    saved = builder is None and any(
        (path / marker).is_file() for marker in ("dataset_dict.json", "state.json")
    )
    try:
        with _quiet_datasets(), tempfile.TemporaryDirectory() as cache:
            # keep_in_memory: the rows outlive the scratch cache the files are converted in
            if saved:
                loaded = datasets.load_from_disk(str(path))
            elif builder is None:
                loaded = datasets.load_dataset(str(path), cache_dir=cache, keep_in_memory=True)
            else:
                loaded = datasets.load_dataset(
                    builder,
                    data_files=str(path),
                    split="train",
                    cache_dir=cache,
                    keep_in_memory=True,
                )
    except (datasets.exceptions.DatasetsError, pa.ArrowException, OSError, ValueError) as err:
        cause = err.__cause__ or err
        fix = (
            "point it at a save_to_disk folder or a folder of data files"
            if builder is None
            else "fix the file (task.local_files.file_reader: itergrpo names each bad line of "
            "JSON lines)"
        )
        raise TaskDataError(
            f"{path}: datasets cannot read it ({type(cause).__name__}: {cause}); {fix}"
        ) from err
    if isinstance(loaded, datasets.Dataset):
        return {None: _dataset_split(str(path), loaded)}
    # a saved DatasetDict keeps each split in its own folder: name rows by it
    return {
        str(split): _dataset_split(str(path / split) if saved else f"{path} [{split}]", ds)
        for split, ds in loaded.items()
    }


def _dataset_split(origin: str, dataset: Any) -> RawData:
    def rows(columns: list[str]) -> Records:
        return _table_rows(origin, dataset.select_columns(columns).to_list())

    return RawData(origin, list(dataset.column_names), True, rows)
