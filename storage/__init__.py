"""Run store: atomic hive-partitioned Parquet tables, stage commits, checkpoints, replay, SQL."""

from storage.errors import (
    ConfigMismatchError,
    CorruptFileError,
    InvalidRunIdError,
    MissingCheckpointError,
    NonFiniteValueError,
    RunLockedError,
    SchemaMismatchError,
    SqlQueryError,
    SqlReadOnlyError,
    StageAlreadyCommittedError,
    StoreError,
    StorePathError,
    UnknownTableError,
)
from storage.reader import StoreReader, open_store
from storage.run_writer import RunWriter, StageAttempt
from storage.schemas import TABLE_SCHEMAS
from storage.store import RunStore

__all__ = [
    "TABLE_SCHEMAS",
    "ConfigMismatchError",
    "CorruptFileError",
    "InvalidRunIdError",
    "MissingCheckpointError",
    "NonFiniteValueError",
    "RunLockedError",
    "RunStore",
    "RunWriter",
    "SchemaMismatchError",
    "SqlQueryError",
    "SqlReadOnlyError",
    "StageAlreadyCommittedError",
    "StageAttempt",
    "StoreError",
    "StorePathError",
    "StoreReader",
    "UnknownTableError",
    "open_store",
]
