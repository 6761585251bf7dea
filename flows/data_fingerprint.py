"""A fingerprint of a data file or folder: its size, its rows where they are cheap to count, and
a SHA-256 of its contents, to tell whether data is still the data a run started on."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

CHUNK = 1 << 20


@dataclass(frozen=True)
class Fingerprint:
    """What was at `path`: a file, or a folder hashed as its files' relative names and contents
    (hidden names, '.cache' and the like, left out)."""

    path: str
    kind: Literal["file", "folder"]
    bytes: int
    files: int
    rows: int | None  # a .jsonl file's non-blank lines, a parquet file's rows; else not counted
    sha256: str

    def same_data(self, other: Fingerprint) -> bool:
        """Whether `other` holds the same contents (wherever it lies)."""
        return (self.kind, self.sha256) == (other.kind, other.sha256)

    def summary(self) -> str:
        """`36 rows, 1480 bytes, sha256 1a2b3c4d5e6f` (a folder: its files instead of rows)."""
        count = f"{self.files} files" if self.kind == "folder" else f"{self.rows} rows"
        shown = f"{count}, " if self.kind == "folder" or self.rows is not None else ""
        return f"{shown}{self.bytes} bytes, sha256 {self.sha256[:12]}"

    def as_record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Fingerprint:
        """A fingerprint as `as_record` stored it; TypeError/ValueError when it is not one."""
        fields = {f.name for f in dataclasses.fields(cls)}
        if set(record) != fields:
            raise ValueError(f"has fields {sorted(record)}, not {sorted(fields)}")
        return cls(**record)


def fingerprint(path: Path) -> Fingerprint | None:
    """The fingerprint of the file or folder at `path`; None when nothing is there."""
    if path.is_file():
        digest, rows = _file_digest(str(path), _stat_key(path))
        return Fingerprint(str(path), "file", path.stat().st_size, 1, rows, digest)
    if not path.is_dir():
        return None
    files = sorted(
        (f for f in path.rglob("*") if f.is_file() and not _hidden(f.relative_to(path))),
        key=lambda f: f.relative_to(path).as_posix(),
    )
    whole, size = hashlib.sha256(), 0
    for file in files:
        digest, _ = _file_digest(str(file), _stat_key(file))
        whole.update(f"{file.relative_to(path).as_posix()}\0{digest}\n".encode())
        size += file.stat().st_size
    return Fingerprint(str(path), "folder", size, len(files), None, whole.hexdigest())


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)


def _stat_key(path: Path) -> tuple[int, ...]:
    """What changes when a file is written (ctime: even a write that restores the mtime)."""
    st = path.stat()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@functools.lru_cache(maxsize=4096)
def _file_digest(path: str, stat_key: tuple[int, ...]) -> tuple[str, int | None]:
    """SHA-256 and rows of the file at `path`; computed once per process while its `stat_key`
    holds (the pre-flight and the run's start check the same data)."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest(), _rows(path)


def _rows(path: str) -> int | None:
    """The rows of a .jsonl file (its non-blank lines) or a parquet file (its metadata says);
    None for other files, whose rows cost a parse to count."""
    if path.endswith(".jsonl"):
        with open(path, "rb") as file:
            return sum(1 for line in file if line.strip())
    if path.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return int(pq.read_metadata(path).num_rows)
        except (OSError, pa.ArrowException):  # not parquet: the task's reader names the problem
            return None
    return None
