"""The Prefect API a CLI run reports to: the user's server when PREFECT_API_URL is set, else
a temporary one started here.

Prefect's own temporary server runs in the CLI's process group, so a terminal's Ctrl-C
(sent to the whole group) stopped the server too, and the run then retried its API calls
for minutes instead of stopping at its next safe point; a `kill -9` of the CLI orphaned it.
This one runs in its own session (Ctrl-C reaches only the run) and is tied to the CLI's
life (Linux: the kernel stops it when the CLI dies, however it dies).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from flows.errors import PrefectApiError
from flows.progress import log

STARTUP_SECONDS = 90.0
# How long the user's PREFECT_API_URL may take to answer its health check before the run is
# refused (a server that is up answers in milliseconds; Prefect itself would retry for minutes).
API_CHECK_SECONDS = 10.0
_PR_SET_PDEATHSIG = 1  # prctl(2)


def _stop_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies (Linux; elsewhere a no-op)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_until_healthy(url: str, server: subprocess.Popen[bytes], server_log: Path) -> None:
    import httpx

    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(
                f"the temporary Prefect server exited with code {server.returncode}; its "
                f"output is in {server_log}:\n{_tail(server_log)}"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(
        f"the temporary Prefect server did not answer at {url} within "
        f"{STARTUP_SECONDS:.0f} s (its output: {server_log}); set PREFECT_API_URL to a "
        "running server"
    )


def _tail(path: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def _send_queued_logs() -> None:
    """Deliver the log lines still queued for the API while the server is up; at exit the
    worker would retry a stopped server ('Error logging to API') for half a minute."""
    from prefect.logging.handlers import APILogHandler

    try:
        APILogHandler().flush()
    except Exception as exc:  # delivery of log copies must not fail a finished run
        log.warning("could not send the last log lines to the Prefect API: %s", exc)


# What a CLI run may do instead of reporting to a server that is down.
RUN_FIXES = (
    "start that server (`prefect server start`), unset PREFECT_API_URL to let the run "
    "start a temporary one, or pass --no-prefect"
)


def check_api_answers(url: str, fixes: str = RUN_FIXES) -> None:
    """PrefectApiError, one line with the `fixes`, unless the Prefect API at `url` is
    healthy."""
    import httpx

    try:
        answer = httpx.get(f"{url.rstrip('/')}/health", timeout=API_CHECK_SECONDS)
    except httpx.HTTPError as exc:
        raise PrefectApiError(
            f"PREFECT_API_URL={url} does not answer ({type(exc).__name__}: {exc}); {fixes}"
        ) from None
    if answer.status_code != 200:
        raise PrefectApiError(
            f"PREFECT_API_URL={url} answered its health check with HTTP {answer.status_code}, "
            f"so it is not a working Prefect API; {fixes}"
        )


@contextlib.contextmanager
def prefect_api(while_starting: Callable[[], None] = lambda: None) -> Iterator[None]:
    """Run the body against the configured Prefect API (refused at once when it does not
    answer), or a temporary server of our own; `while_starting` runs before the body, while
    that server boots (a refusal it raises stops the server, whose output is then dropped)."""
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    if PREFECT_API_URL.value():
        check_api_answers(str(PREFECT_API_URL.value()))
        while_starting()
        yield
        return
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        **get_current_settings().to_environment_variables(exclude_unset=True),
        # What Prefect's own temporary server sets: the API only, no background services.
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
        "PREFECT_SERVER_LOGGING_LEVEL": "ERROR",
    }
    # The server's own output goes to a file: stopped while a client still has a request in
    # flight (a second Ctrl-C stops the run at once), it logs a database pool reset with a
    # traceback that is not the run's and would read as its failure. Kept if it failed.
    fd, name = tempfile.mkstemp(prefix="itergrpo-prefect-server-", suffix=".log")
    server_log = Path(name)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            "prefect.server.api.server:create_app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "error",
            "--lifespan",
            "on",
        ],
        env=env,
        start_new_session=True,  # a terminal's Ctrl-C reaches the run, not its server
        preexec_fn=_stop_with_parent,  # only a prctl call, between fork and exec
        stdout=fd,
        stderr=subprocess.STDOUT,
    )
    os.close(fd)  # the server holds its own copy
    failed = False  # the server itself: its output is kept for the error to point at
    try:
        while_starting()
        try:
            _wait_until_healthy(url, server, server_log)
        except RuntimeError:
            failed = True
            raise
        log.info("temporary Prefect server on %s", url)
        with temporary_settings({PREFECT_API_URL: url}):
            try:
                yield
            finally:
                _send_queued_logs()
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        if not failed:
            server_log.unlink(missing_ok=True)
