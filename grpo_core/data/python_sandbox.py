"""A Python tool's sandbox: a program runs in a fresh process and directory under CPU-time,
memory, file-size and open-file limits, a wall timeout, an audit hook that refuses new
processes, sockets, native code and writes outside its directory (sandbox_child.py), and a
network namespace of its own where `unshare` can make one. A runaway, crashing or hostile
program becomes a `ToolResult` with its error kind, never a stalled or broken caller."""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from grpo_core.data.sandbox_child import FORBIDDEN_EXIT, MEMORY_EXIT, OUTPUT_EXIT

log = logging.getLogger(__name__)

ToolStatus = Literal[
    "ok", "error", "forbidden", "timeout", "cpu_limit", "memory_limit", "output_limit"
]
_CHILD = Path(__file__).with_name("sandbox_child.py")


class SandboxLimits(BaseModel):
    """What one program may use."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    wall_seconds: float = Field(default=5.0, gt=0.0, le=600.0)
    cpu_seconds: int = Field(default=5, ge=1, le=600)
    memory_mb: int = Field(default=512, ge=64, le=65536)
    output_bytes: int = Field(
        default=65536, ge=1024, le=1 << 30, description="Largest stdout, stderr or file."
    )


@dataclass(frozen=True)
class ToolResult:
    """What a program did: its status, its (capped) output and error text, its wall seconds."""

    status: ToolStatus
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def observation(self, max_chars: int = 2000) -> str:
        """The text the model reads back: the printed output, or the error's last line."""
        if self.ok:
            return self.stdout[-max_chars:]
        lines = [line for line in self.stderr.strip().splitlines() if line.strip()]
        detail = lines[-1] if lines else ""
        return f"{self.status}: {detail}"[:max_chars] if detail else self.status


@functools.cache
def network_isolation() -> list[str]:
    """The command prefix that gives a program no network: `unshare --net` as root, with a
    user namespace otherwise; [] where neither works (the audit hook still refuses sockets).
    Probed once per process, and the choice logged."""
    for prefix in (["unshare", "--net"], ["unshare", "--net", "--map-root-user"]):
        if shutil.which(prefix[0]) is None:
            break
        probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
        if probe.returncode == 0:
            log.info("python sandbox: own process and directory, limits, audit hook, %s", prefix)
            return prefix
    log.info(
        "python sandbox: own process and directory, limits, audit hook; no network namespace "
        "(unshare unavailable), so sockets are refused by the audit hook alone"
    )
    return []


def _status(code: int, timed_out: bool, limits: SandboxLimits, seconds: float) -> ToolStatus:
    if timed_out:
        return "timeout"
    if code == 0:
        return "ok"
    if code == FORBIDDEN_EXIT:
        return "forbidden"
    if code in (-signal.SIGXCPU, -signal.SIGKILL) and seconds < limits.wall_seconds:
        return "cpu_limit"
    if code in (OUTPUT_EXIT, -signal.SIGXFSZ):
        return "output_limit"
    if code == MEMORY_EXIT:
        return "memory_limit"
    return "error"


def _read_capped(path: Path, limit: int) -> str:
    with path.open("rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")


def run_python(source: str, limits: SandboxLimits | None = None) -> ToolResult:
    """Run `source` in the sandbox and say what happened."""
    limits = limits or SandboxLimits()
    child_limits = {
        "cpu_seconds": limits.cpu_seconds,
        "memory_bytes": limits.memory_mb << 20,
        "file_bytes": limits.output_bytes,
    }
    with tempfile.TemporaryDirectory(prefix="itergrpo-tool-") as work:
        root = Path(work)
        (root / "main.py").write_text(source, encoding="utf-8")
        out, err = root / "stdout", root / "stderr"
        command = [
            *network_isolation(),
            sys.executable,
            "-I",
            "-B",
            str(_CHILD),
            json.dumps(child_limits),
            "main.py",
        ]
        start = time.perf_counter()
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = subprocess.Popen(
                command,
                cwd=root,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": work},
                start_new_session=True,  # its own process group: killed whole at the timeout
            )
            timed_out = False
            try:
                proc.wait(timeout=limits.wall_seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        seconds = time.perf_counter() - start
        status = _status(proc.returncode, timed_out, limits, seconds)
        return ToolResult(
            status=status,
            stdout=_read_capped(out, limits.output_bytes),
            stderr=_read_capped(err, limits.output_bytes),
            seconds=seconds,
        )
