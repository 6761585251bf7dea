"""The temporary Prefect server boots while the run's checks and imports run: a check that
refuses the run stops the server and leaves nothing behind; a run that starts finds it up."""

from __future__ import annotations

import tempfile
from pathlib import Path

import httpx
import pytest
from prefect.settings import PREFECT_API_URL

from flows.errors import PreflightError
from flows.prefect_server import prefect_api


def server_logs() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("itergrpo-prefect-server-*.log"))


def test_a_refusal_while_the_server_boots_stops_it_and_keeps_no_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    before = server_logs()
    seen: list[Path] = []

    def refuse() -> None:
        seen.extend(server_logs() - before)  # the server is booting, its output goes here
        raise PreflightError("policy.path: no such directory")

    with pytest.raises(PreflightError, match=r"policy\.path"), prefect_api(while_starting=refuse):
        pytest.fail("the body must not run after a refusal")
    assert len(seen) == 1 and not seen[0].exists()
    assert server_logs() == before


def test_the_body_runs_against_the_server_after_the_checks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    order: list[str] = []
    with prefect_api(while_starting=lambda: order.append("checks")):
        order.append("body")
        url = str(PREFECT_API_URL.value())
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    assert order == ["checks", "body"]
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{url}/health", timeout=2)
