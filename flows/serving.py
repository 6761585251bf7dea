"""`itergrpo serve`: the Prefect server a served deployment needs, and the runner that serves
it until Ctrl-C or SIGTERM.

Without PREFECT_API_URL, Prefect serves against a temporary in-process API, no UI shows the
deployment, and each flow run starts a temporary server of its own: serve refuses instead,
with the two commands to run. Prefect's runner answers SIGTERM with Runner.stop, which in
the runner's own event loop only makes a coroutine that is never awaited, and exits without
stopping its flow runs; here SIGTERM runs that coroutine.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from typing import Any

from prefect.runner import Runner
from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL

from flows.errors import PrefectApiError
from flows.prefect_server import check_api_answers

SERVER_COMMANDS = (
    "start a Prefect server (`prefect server start --host 127.0.0.1 --port 4200`), then "
    "`export PREFECT_API_URL=http://127.0.0.1:4200/api` here and serve again"
)


def served_api() -> str:
    """The Prefect API the deployment is served on: PREFECT_API_URL, which must answer;
    PrefectApiError with the commands to run when it is unset."""
    url = PREFECT_API_URL.value()
    if not url:
        raise PrefectApiError(
            "PREFECT_API_URL is not set: a served deployment needs a Prefect server whose UI "
            "shows it and that its flow runs report to (without one, each flow run starts a "
            f"temporary server of its own); {SERVER_COMMANDS}"
        )
    check_api_answers(
        str(url), "start that server (`prefect server start`), or point PREFECT_API_URL at one"
    )
    return str(url)


def ui_address(deployment_id: Any) -> str | None:
    """The deployment's page in the Prefect UI, None where the API has no UI address."""
    base = PREFECT_UI_URL.value()
    return f"{str(base).rstrip('/')}/deployments/deployment/{deployment_id}" if base else None


class _StoppableRunner(Runner):
    """Prefect's runner, whose SIGTERM stops it as Runner.astop does: flow runs in progress
    are cancelled (each stops at its next safe point, `interrupted` and resumable), the
    polling ends, the runner leaves its context (pausing the deployment's schedule) and
    returns. A second SIGTERM cancels the serving task at once."""

    stopped_by = "SIGINT"
    serving: asyncio.Task[None] | None = None
    stopping_task: asyncio.Task[None] | None = None

    def handle_sigterm(self, *args: Any) -> None:
        self.stopped_by = "SIGTERM"
        if self.serving is not None:  # the handler runs in the loop's thread, between steps
            self.serving.get_loop().call_soon_threadsafe(self._stop)

    def _stop(self) -> None:
        if self.started and self.stopping_task is None:
            self.stopping_task = asyncio.ensure_future(self.astop())
        elif self.serving is not None:  # not yet polling, or a second SIGTERM
            self.serving.cancel()

    async def serve(self, on_serving: Callable[[], None]) -> None:
        """Run the runner; `on_serving` is called once a SIGTERM would stop it cleanly."""
        self.serving = asyncio.current_task()
        signal.signal(signal.SIGTERM, self.handle_sigterm)  # as start() does, but before it
        on_serving()
        await self.start()


def serve_until_stopped(
    flow: Any,
    *,
    name: str,
    on_serving: Callable[[str | None], None],
    **deployment: Any,
) -> str:
    """Register `flow` as deployment `name` (`deployment`: Prefect's add_flow arguments: cron,
    parameters, description, tags), call `on_serving` with its UI page once it is served,
    and run its flow runs until SIGTERM or Ctrl-C stops the runner; which one ('SIGTERM',
    'SIGINT'). The deployment stays registered, its schedule paused."""
    runner = _StoppableRunner(name=name, limit=None)  # as Flow.serve: no limit on its runs
    page = ui_address(runner.add_flow(flow, name=name, **deployment))
    # the serving task cancelled (a SIGTERM before the runner polled, or a second one), or
    # asyncio's KeyboardInterrupt after Ctrl-C
    with contextlib.suppress(asyncio.CancelledError, KeyboardInterrupt):
        asyncio.run(runner.serve(lambda: on_serving(page)))
    return runner.stopped_by
