"""Errors raised by the run store; all derive from StoreError so callers can catch one type,
and StoreError from the one user-error base (the only import of `grpo_core` in storage)."""

from __future__ import annotations

from pathlib import Path

from grpo_core.contracts.errors import UserError


class StoreError(UserError):
    """Base class of every run-store error: the store, a run id or a stored file to fix."""


class InvalidRunIdError(StoreError, ValueError):
    """A run id that cannot name a directory of the store."""


class MissingCheckpointError(StoreError, FileNotFoundError):
    """A checkpoint a committed stage wrote, or a resume point, that is gone or incomplete."""


class StorePathError(StoreError):
    """The store root is a file, or not writable."""


class UnknownTableError(StoreError, KeyError):
    """A table name that is not in TABLE_SCHEMAS."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class SchemaMismatchError(StoreError, ValueError):
    """Rows whose columns or types do not match the table schema."""


class NonFiniteValueError(SchemaMismatchError):
    """Rows holding NaN or infinite floats (the store never holds them)."""


class RunLockedError(StoreError):
    """Another live process holds the run's write lock."""

    def __init__(self, message: str, pid: int | None = None, host: str | None = None) -> None:
        super().__init__(message)
        self.pid = pid
        self.host = host


class ConfigMismatchError(StoreError):
    """A run reopened with a config different from the one it was created with."""

    def __init__(self, message: str, keys: list[str]) -> None:
        super().__init__(message)
        self.keys = keys


class StageAlreadyCommittedError(StoreError):
    """A stage (iteration, name) that is already committed was started or committed again."""


class CorruptFileError(StoreError):
    """A Parquet file in the store that cannot be read."""

    def __init__(self, path: Path | str, reason: str = "") -> None:
        self.path = Path(path)
        detail = f": {reason}" if reason else ""
        super().__init__(
            f"corrupt Parquet file in the store: {self.path}{detail} "
            "(move it aside or delete it; the other files stay readable)"
        )


class SqlQueryError(StoreError):
    """A SQL query DuckDB refused (a syntax error, an unknown column, ...)."""


class SqlReadOnlyError(StoreError):
    """A SQL statement that would write (the SQL layer is read-only)."""


class DamagedRunRecordError(StoreError):
    """A run's config.yaml or status.json that does not parse as the mapping it must be."""


class DiskFullError(StoreError, OSError):
    """A write into the store that ran out of space (or quota); nothing partial was kept."""
