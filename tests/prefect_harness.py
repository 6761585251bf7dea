"""One Prefect test server for the whole test run, entered test by test.

`prefect_test_harness` starts a server subprocess (5-7 s of CPU: imports and database
migrations) each time it is entered, and five test modules entered it. Here the server starts
once; `harness_settings` then gives a test, for its own duration only, what the harness gives
the code inside it: the API URL, the database URL, the server as Prefect's default in-process
one, and the queued logs and events sent before the test ends. Outside it, Prefect's settings
are untouched, so the tests that start a CLI's temporary server or expect no API see no
difference. Tests on a shared server look only at their own flow runs (`new_flow_runs`).
The server stops after the last test that uses it (tests/conftest.py), not at the session's end.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

SERVER_STARTUP_SECONDS = 120


@contextmanager
def prefect_test_server(db_dir: Path) -> Iterator[tuple[Any, str]]:
    """A Prefect server subprocess on a fresh SQLite file under `db_dir`; (server, db_url)."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL, temporary_settings

    db_url = "sqlite+aiosqlite:///" + str(db_dir / "prefect-test.db")
    # The subprocess takes its settings from the context it is started in.
    with temporary_settings(updates={PREFECT_SERVER_DATABASE_CONNECTION_URL: db_url}):
        server = SubprocessASGIServer(port=SubprocessASGIServer().find_available_port())
        server.start(timeout=SERVER_STARTUP_SECONDS)
    try:
        yield server, db_url
    finally:
        server.stop()


@contextmanager
def harness_settings(server: Any, db_url: str) -> Iterator[None]:
    """Inside: Prefect talks to `server`, as inside `prefect_test_harness`."""
    import prefect.context
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.server.database.dependencies import temporary_database_interface
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_DATABASE_CONNECTION_URL,
        temporary_settings,
    )
    from prefect.utilities.asyncutils import run_coro_as_sync

    prior_default = SubprocessASGIServer._instances.get(None)
    with ExitStack() as stack:
        stack.enter_context(temporary_database_interface())
        stack.enter_context(
            temporary_settings(
                updates={
                    PREFECT_SERVER_DATABASE_CONNECTION_URL: db_url,
                    PREFECT_API_URL: server.api_url,
                }
            )
        )
        # Code that asks for Prefect's default server during a flow run finds this one.
        SubprocessASGIServer._instances[None] = server
        stack.enter_context(
            prefect.context._temporary_global_settings_context(
                prefect.context.get_settings_context()
            )
        )
        try:
            yield
        finally:

            async def drain() -> None:  # this test's logs and events, before the next test
                try:
                    result = APILogWorker.instance().drain()
                    if inspect.isawaitable(result):
                        await result
                except RuntimeError:  # the worker never started
                    pass
                result = EventsWorker.drain_all()
                if inspect.isawaitable(result):
                    await result

            run_coro_as_sync(drain())
            if prior_default is not None:
                SubprocessASGIServer._instances[None] = prior_default
            else:
                SubprocessASGIServer._instances.pop(None, None)


def flow_run_ids() -> set[Any]:
    """The ids of every flow run the server holds."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return {run.id for run in client.read_flow_runs()}


def new_flow_runs(before: set[Any]) -> list[Any]:
    """The flow runs created since `before` (from `flow_run_ids`): a test's own, on a server
    that other tests used first."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return [run for run in client.read_flow_runs() if run.id not in before]
