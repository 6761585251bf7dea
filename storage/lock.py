"""The per-run write lock: a file holding the owner's PID, host and start time.

Creation is atomic (hard link of a complete temp file), so a lock file is never seen half
written. A lock whose PID is dead on this host is stale and is taken over with a warning.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import logging
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from storage.atomic import temp_sibling
from storage.errors import RunLockedError

log = logging.getLogger(__name__)


def _proc_start_ticks(pid: int) -> str | None:
    """The kernel start time of `pid` (tells a live owner from a reused PID); None off Linux."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _holder_alive(holder: dict[str, Any]) -> bool:
    pid = int(holder.get("pid", -1))
    if pid <= 0 or not _pid_alive(pid):
        return False
    recorded = holder.get("proc_start")
    current = _proc_start_ticks(pid)
    return recorded is None or current is None or recorded == current


@contextlib.contextmanager
def _guard(lock_path: Path) -> Iterator[None]:
    """Serialise lock acquisition between processes (check-and-take-over is not atomic)."""
    guard = lock_path.with_name(lock_path.name + ".guard")
    with open(guard, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class RunLock:
    """An acquired lock file; `release()` removes it if it is still ours."""

    def __init__(self, path: Path, token: str) -> None:
        self.path = path
        self.token = token

    def release(self) -> None:
        with _guard(self.path):
            holder = read_lock(self.path)
            if holder is not None and holder.get("token") == self.token:
                self.path.unlink(missing_ok=True)


def read_lock(path: Path) -> dict[str, Any] | None:
    """The lock file's content, None if there is no lock."""
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"pid": -1, "host": "?", "started_at": "?", "unreadable": True}
    return data


def _held(holder: dict[str, Any]) -> bool:
    """Whether `holder` still holds its lock: alive, or on another host (cannot be checked)."""
    return holder.get("host") != socket.gethostname() or _holder_alive(holder)


def lock_is_held(path: Path) -> bool:
    """Whether a live process holds the lock at `path`."""
    holder = read_lock(path)
    return holder is not None and _held(holder)


def _refuse_a_live_holder(path: Path, run_id: str, holder: dict[str, Any]) -> None:
    """RunLockedError if `holder` is alive (or on another host, where it cannot be checked)."""
    same_host = holder.get("host") == socket.gethostname()
    if _held(holder):
        where = "" if same_host else f" on host {holder.get('host')} (cannot check it)"
        raise RunLockedError(
            f"run {run_id!r} is locked by PID {holder.get('pid')}{where} since "
            f"{holder.get('started_at')}; wait for it to finish, or delete {path} "
            "if that process is gone",
            pid=holder.get("pid"),
            host=holder.get("host"),
        )


def check_unlocked(path: Path, run_id: str) -> None:
    """Raise RunLockedError if a live process holds the lock at `path`; writes nothing."""
    holder = read_lock(path)
    if holder is not None:
        _refuse_a_live_holder(path, run_id, holder)


def acquire_lock(path: Path, run_id: str) -> RunLock:
    """Take the lock at `path` or raise RunLockedError naming the live holder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    me = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started_at": dt.datetime.now(dt.UTC).isoformat(),
        "proc_start": _proc_start_ticks(os.getpid()),
        "token": uuid.uuid4().hex,
    }
    with _guard(path):
        holder = read_lock(path)
        if holder is not None:
            _refuse_a_live_holder(path, run_id, holder)
            log.warning(
                "taking over the stale lock of run %r: PID %s (started %s) is no longer running",
                run_id,
                holder.get("pid"),
                holder.get("started_at"),
            )
            path.unlink()
        tmp = temp_sibling(path)
        tmp.write_text(json.dumps(me))
        try:
            os.link(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return RunLock(path, str(me["token"]))
