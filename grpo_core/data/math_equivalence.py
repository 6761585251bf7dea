"""LaTeX answer equivalence by math-verify (fractions and decimals, radicals, tuples, intervals,
sets, degrees, percentages, matrices, multiple-choice letters, expressions), in a worker
process of its own.

Why a process: math-verify's own timeout uses SIGALRM, which works only in a process's main
thread, and no in-process timeout stops a comparison stuck in C (a huge integer power). The
worker (grpo_core/data/math_worker.py) is started on first use, answers one request at a
time, and is killed and restarted when a request runs past `timeout_s`; the comparison then
counts as not equal. So the timeout holds wherever itergrpo checks answers: the main thread,
a Prefect task, a Ray worker, any thread.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import subprocess
import sys
import threading
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0
# The worker's start-up (Python and math-verify's imports) is not a request: on a loaded
# machine it takes seconds, and counting it would time out the first comparison.
STARTUP_TIMEOUT_S = 120.0


class MathVerifyTimeout(Exception):
    """A comparison ran past its timeout (the worker was restarted)."""


class MathVerifier:
    """Answers compared by math-verify in a worker process (started on first use)."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.timeouts = 0  # requests that ran past the timeout in this process
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        atexit.register(self.close)

    def equal(self, gold: str, pred: str) -> bool:
        """Whether `pred` is the same answer as `gold`; a timeout counts as not equal."""
        try:
            return bool(self._ask(op="equal", gold=gold, pred=pred))
        except MathVerifyTimeout:
            return False

    def canonical(self, answer: str) -> str:
        """A key that equal answers share (numbers rounded to 6 digits), for majority votes."""
        try:
            return str(self._ask(op="canonical", answer=answer))
        except MathVerifyTimeout:
            return "".join(answer.split())

    def check_gold(self, gold: str) -> str | None:
        """None when a gold answer can be compared, else what is wrong with it."""
        try:
            problem = self._ask(op="check_gold", gold=gold)
        except MathVerifyTimeout:
            return f"math-verify took over {self.timeout_s:g} s to read it"
        return None if problem is None else str(problem)

    def close(self) -> None:
        """Stop the worker, if one runs."""
        with self._lock:
            self._stop()

    def _ask(self, **request: Any) -> Any:
        with self._lock:
            process = self._running()
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write(json.dumps(request) + "\n")
            process.stdin.flush()
            ready, _, _ = select.select([process.stdout], [], [], self.timeout_s)
            if not ready:
                self.timeouts += 1
                log.warning(
                    "math-verify ran past %.1f s on %s; counted as not equal, worker restarted",
                    self.timeout_s,
                    {k: str(v)[:60] for k, v in request.items()},
                )
                self._stop()
                raise MathVerifyTimeout(str(request)[:200])
            line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"the math-verify worker exited (code {process.poll()})")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"math-verify worker: {reply['error']}")
        return reply["value"]

    def _running(self) -> subprocess.Popen[str]:
        if self._process is None or self._process.poll() is not None:
            process = subprocess.Popen(
                [sys.executable, "-m", "grpo_core.data.math_worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONPATH": _our_path()},
            )
            assert process.stdout is not None
            ready, _, _ = select.select([process.stdout], [], [], STARTUP_TIMEOUT_S)
            if not ready or json.loads(process.stdout.readline() or "{}").get("ready") is not True:
                process.kill()
                raise RuntimeError(
                    f"the math-verify worker did not start within {STARTUP_TIMEOUT_S:.0f} s "
                    f"(exit code {process.poll()}): is math-verify installed?"
                )
            self._process = process
        return self._process

    def _stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._process = None


def _our_path() -> str:
    """PYTHONPATH that finds this package in the worker, whatever the caller's directory."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
