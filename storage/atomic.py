"""Atomic file and directory writes: temp path in the same directory, fsync, rename, fsync dir."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from storage.errors import DiskFullError

TMP_PREFIX = ".tmp-"
# Out of space, or out of the user's quota on a shared filesystem: the same fix.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


# Free bytes under which a failed write is taken for a full disk: safetensors and torch.save
# report running out of space as their own errors (SafetensorError, RuntimeError), not as an
# OSError with ENOSPC, so the disk itself is asked.
NEARLY_FULL_BYTES = 1 << 20


def disk_is_full(directory: Path) -> bool:
    """Whether the disk holding `directory` has (almost) no space left for this user."""
    try:
        return shutil.disk_usage(directory).free < NEARLY_FULL_BYTES
    except OSError:
        return False


def disk_full_error(path: Path, exc: BaseException) -> DiskFullError:
    """The one-line error for a write to `path` that ran out of space (temp files removed)."""
    code = exc.errno if isinstance(exc, OSError) and exc.errno else errno.ENOSPC
    return DiskFullError(
        f"no space left to write {path} ({os.strerror(code)}); nothing "
        "partial was kept: free space on that disk (or move the store to a larger one, "
        "--store), then resume the run"
    )


def temp_sibling(path: Path) -> Path:
    """A fresh hidden temp path next to `path` (same filesystem, so rename is atomic)."""
    return path.with_name(f"{TMP_PREFIX}{path.name}.{uuid.uuid4().hex[:12]}")


def fsync_dir(directory: Path) -> None:
    """Flush a directory entry (a rename or create inside it) to disk."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def current_umask() -> int:
    """The process's umask (read by setting and restoring it: the only portable way)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _honour_umask(directory: Path) -> None:
    """Give every file and folder under `directory` the mode a plain create would have.

    Some writers create files 0600 whatever the umask (safetensors' `save_file` does), so
    teammates and workers under another user could not read a checkpoint; a shared group
    (umask 002) or world-readable (022) store needs the mode the umask allows.
    """
    mask = current_umask()
    for child in directory.rglob("*"):
        if child.is_symlink():
            continue
        executable = child.is_dir() or child.stat().st_mode & 0o111
        child.chmod((0o777 if executable else 0o666) & ~mask)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _atomic_target(path: str | Path) -> Iterator[Path]:
    """Yield a temp path; on success fsync it and rename it onto `path`, else remove it."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(final)
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, final)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            raise disk_full_error(final, exc) from exc
        raise
    fsync_dir(final.parent)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` so readers see the old file or the whole new one, never a part."""
    with _atomic_target(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    """atomic_write_bytes for UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_parquet(path: str | Path, table: pa.Table) -> None:
    """Write `table` as one Parquet file at `path`, atomically."""
    with _atomic_target(path) as tmp:
        pq.write_table(table, tmp)


@contextlib.contextmanager
def atomic_directory(final_path: str | Path, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temp directory next to `final_path`; rename it into place on success.

    On an exception the temp directory is removed and `final_path` is untouched. An
    existing `final_path` is an error unless `overwrite`, in which case it is moved aside,
    the new directory renamed in, and only then the old one deleted.
    """
    final = Path(final_path)
    if final.exists() and not overwrite:
        raise FileExistsError(f"{final} already exists (pass overwrite=True to replace it)")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(final)
    tmp.mkdir()
    try:
        yield tmp
        _honour_umask(tmp)
        for child in tmp.rglob("*"):
            if child.is_file():
                _fsync_file(child)
        fsync_dir(tmp)
    except BaseException as exc:
        # asked before the temp directory is removed, which frees what it had written
        full = isinstance(exc, Exception) and disk_is_full(final.parent)
        shutil.rmtree(tmp, ignore_errors=True)
        if (isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS) or full:
            raise disk_full_error(final, exc) from exc
        raise
    old: Path | None = None
    if final.exists():
        old = temp_sibling(final.with_name(final.name + ".old"))
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
