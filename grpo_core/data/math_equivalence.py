"""LaTeX answer equivalence by math-verify (fractions and decimals, radicals, tuples, intervals,
sets, degrees, percentages, matrices, multiple-choice letters, expressions), in a worker
process of its own.

Why a process: math-verify's own timeout uses SIGALRM, which works only in a process's main
thread, and no in-process timeout stops a comparison stuck in C (a huge integer power). The
worker (grpo_core/data/math_worker.py) is started on first use, answers one request at a
time, and is killed and restarted when a request runs past `timeout_s`; the comparison then
counts as not equal. So the timeout holds wherever itergrpo checks answers: the main thread,
a Prefect task, a Ray worker, any thread. The worker's start (importing sympy and
math-verify: seconds on a busy machine) is waited for apart, up to `START_TIMEOUT_S`, so it
never eats a request's timeout.

Verdicts are kept per (gold, answer) pair in this process (an LRU of `cache_size`): a policy
repeats its answers, within a group and across the steps of a stage, and a repeat then costs a
dictionary look-up instead of a worker round trip (bench/answer_check.py measures the share).
A timeout is never kept: the pair is asked again next time.
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
from functools import lru_cache
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0
# The worker's start-up (Python, math-verify's imports, a first comparison) is not a request:
# on a loaded machine it takes seconds, and counting it would time out the first comparison.
# A worker that is not ready by then is an error, not a verdict.
START_TIMEOUT_S = 300.0
DEFAULT_CACHE_SIZE = 1 << 17  # verdicts kept: ~130k pairs, tens of MB at most


class MathVerifyTimeout(Exception):
    """A comparison ran past its timeout (the worker was restarted)."""


class MathVerifier:
    """Answers compared by math-verify in a worker process (started on first use)."""

    def __init__(
        self, timeout_s: float = DEFAULT_TIMEOUT_S, cache_size: int = DEFAULT_CACHE_SIZE
    ) -> None:
        self.timeout_s = timeout_s
        self.timeouts = 0  # requests that ran past the timeout in this process
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        # lru_cache keeps no result of a call that raised: a timeout is asked again.
        self._equal = lru_cache(maxsize=cache_size)(self._ask_equal)
        self._canonical = lru_cache(maxsize=cache_size)(self._ask_canonical)
        atexit.register(self.close)

    def equal(self, gold: str, pred: str) -> bool:
        """Whether `pred` is the same answer as `gold`; a timeout counts as not equal."""
        try:
            return self._equal(gold, pred)
        except MathVerifyTimeout:
            return False

    def canonical(self, answer: str) -> str:
        """A key that equal answers share (numbers rounded to 6 digits), for majority votes."""
        try:
            return self._canonical(answer)
        except MathVerifyTimeout:
            return "".join(answer.split())

    def clear_cache(self) -> None:
        """Forget the kept verdicts (the worker's parses stay until it restarts)."""
        self._equal.cache_clear()
        self._canonical.cache_clear()

    def _ask_equal(self, gold: str, pred: str) -> bool:
        return bool(self._ask(op="equal", gold=gold, pred=pred))

    def _ask_canonical(self, answer: str) -> str:
        return str(self._ask(op="canonical", answer=answer))

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
            ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_S)
            if not ready or json.loads(process.stdout.readline() or "{}").get("ready") is not True:
                process.kill()
                raise RuntimeError(
                    f"the math-verify worker did not start within {START_TIMEOUT_S:g} s "
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
