"""The sandboxed side of grpo_core/data/python_sandbox.py: run as a script in a fresh process
(`python -I -B sandbox_child.py LIMITS_JSON PROGRAM`), it lowers its own resource limits,
installs an audit hook that refuses processes, sockets, native code and writes outside its
working directory, then runs the program. Standard library only; nothing of ours is imported.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import sys
from typing import Any

# Exit statuses of a program stopped by the audit hook, by the file-size limit (output or a
# file: Python ignores SIGXFSZ, so the write raises) and by the memory limit; the message is on
# stderr.
FORBIDDEN_EXIT, OUTPUT_EXIT, MEMORY_EXIT = 3, 4, 5
# Modules whose import alone would give a way around the hook (raw fork/exec, native calls).
FORBIDDEN_IMPORTS = frozenset(
    {"_posixsubprocess", "ctypes", "_ctypes", "cffi", "multiprocessing", "_multiprocessing"}
)
# Audit events refused outright: new processes, sockets, signals to others, native code.
FORBIDDEN_EVENTS = frozenset(
    {
        "os.fork",
        "os.forkpty",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.system",
        "os.kill",
        "os.killpg",
        "subprocess.Popen",
        "pty.spawn",
        "socket.__new__",
        "socket.connect",
        "socket.bind",
        "socket.getaddrinfo",
        "ctypes.dlopen",
        "ctypes.dlsym",
        "ctypes.cdata",
    }
)
# Audit events whose first argument is a path that must stay inside the working directory.
PATH_EVENTS = frozenset(
    {
        "os.remove",
        "os.rename",
        "os.rmdir",
        "os.mkdir",
        "os.chmod",
        "os.chown",
        "os.symlink",
        "os.link",
        "os.truncate",
        "os.utime",
        "os.chdir",
        "shutil.rmtree",
        "shutil.copyfile",
    }
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


class SandboxViolation(PermissionError):
    """An action the sandbox refuses."""


def _limit(kind: int, value: int) -> None:
    hard = resource.getrlimit(kind)[1]
    cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(kind, (cap, cap))


def set_limits(limits: dict[str, int]) -> None:
    _limit(resource.RLIMIT_CPU, limits["cpu_seconds"])
    _limit(resource.RLIMIT_AS, limits["memory_bytes"])
    _limit(resource.RLIMIT_FSIZE, limits["file_bytes"])
    _limit(resource.RLIMIT_NOFILE, 64)
    _limit(resource.RLIMIT_CORE, 0)
    if os.geteuid() != 0:  # root is not held to RLIMIT_NPROC: the audit hook refuses forks
        _limit(resource.RLIMIT_NPROC, 1)


def _inside(path: Any, root: str) -> bool:
    if isinstance(path, int):  # a file descriptor: one the program already holds
        return True
    real = os.path.realpath(os.fsdecode(path))
    return real == root or real.startswith(root + os.sep)


def audit_hook(root: str) -> Any:
    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in FORBIDDEN_EVENTS:
            raise SandboxViolation(f"sandbox: {event} is not allowed")
        if event == "import" and args[0].split(".")[0] in FORBIDDEN_IMPORTS:
            raise SandboxViolation(f"sandbox: import {args[0]} is not allowed")
        if event == "open" and args[0] is not None:
            path, mode, flags = args
            writes = any(c in (mode or "") for c in "wax+") or bool((flags or 0) & _WRITE_FLAGS)
            if writes and not _inside(path, root):
                raise SandboxViolation(f"sandbox: writing {path} (outside the working directory)")
        if event in PATH_EVENTS and args and not _inside(args[0], root):
            raise SandboxViolation(f"sandbox: {event} on {args[0]} (outside the working directory)")

    return hook


def main() -> int:
    limits, program = json.loads(sys.argv[1]), sys.argv[2]
    with open(program, encoding="utf-8") as f:
        source = f.read()
    code = compile(source, "<tool>", "exec")
    set_limits(limits)
    sys.addaudithook(audit_hook(os.path.realpath(os.getcwd())))
    try:
        exec(code, {"__name__": "__main__"})
        sys.stdout.flush()  # here, so a write over the file-size limit is caught below
    except SandboxViolation as exc:
        print(exc, file=sys.stderr)
        return FORBIDDEN_EXIT
    except MemoryError:
        print(f"sandbox: memory limit of {limits['memory_bytes'] >> 20} MB", file=sys.stderr)
        return MEMORY_EXIT
    except OSError as exc:
        if exc.errno != errno.EFBIG:
            raise
        print(f"sandbox: output or a file over {limits['file_bytes']} bytes", file=sys.stderr)
        sys.stderr.flush()
        os._exit(OUTPUT_EXIT)  # not sys.exit: flushing the rest of stdout would fail again
    return 0


if __name__ == "__main__":
    sys.exit(main())
