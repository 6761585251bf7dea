"""Shared test settings: offline, no telemetry, deterministic CPU threads, hypothesis profile."""

import os
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch
from hypothesis import HealthCheck, settings

from storage.store import RunStore

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=30, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(scope="session")
def micro_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunStore, str]:
    """One completed `micro` run, shared by the tests that only read it (or copy its store)."""
    from flows.loop import execute_run, planned_stages
    from tests.flow_helpers import micro_config

    root = tmp_path_factory.mktemp("store")
    cfg = micro_config(root, "e2e")
    results = execute_run(cfg)
    assert [(r.stage, r.iteration) for r in results] == planned_stages(cfg)
    assert not any(r.skipped for r in results)
    return RunStore(root), "e2e"


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Tiny models run ~25x faster on one thread than on two contended cores; modules of
    tiny-model tests use it with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def prefect_test_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str]]:
    """One Prefect server subprocess for every test that uses `prefect_harness`."""
    from tests.prefect_harness import prefect_test_server as start_server

    with start_server(tmp_path_factory.mktemp("prefect")) as server:
        yield server


@pytest.fixture
def prefect_harness(
    request: pytest.FixtureRequest, prefect_test_server: tuple[Any, str]
) -> Iterator[None]:
    """What `prefect_test_harness` gives a test, on the session's server (started once)."""
    from tests.prefect_harness import harness_settings

    with harness_settings(*prefect_test_server):
        yield
    users = [
        i for i in request.session.items if "prefect_harness" in getattr(i, "fixturenames", ())
    ]
    if users and request.node is users[-1]:
        prefect_test_server[0].stop()  # its last user: not idle (~1 s CPU a minute) to the end
