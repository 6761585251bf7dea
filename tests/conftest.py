"""Shared test settings: offline, no telemetry, deterministic CPU threads, hypothesis profile,
and how the suite splits over pytest-xdist workers (`make test` runs two)."""

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# OpenMP threads sleep when idle instead of spinning (read once, when torch loads libgomp; the
# runs a test starts inherit it). The demo-scale test at two threads (preset_threads) shares
# the two cores with the other xdist worker: spinning, its threads burnt the cores they wait
# for (578 s CPU and over 1200 s beside a one-thread busy loop on a loaded machine, against
# 110 s CPU and 187 s asleep). Only waiting changes: each thread's share of the work, so every
# result, does not (the same AUROCs to the last digit).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch
from filelock import FileLock
from hypothesis import HealthCheck, settings

from storage.store import RunStore

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=30, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist each worker takes its share of the cores, it and the runs it starts
    (children inherit both variables; run.num_threads is capped by ITERGRPO_MAX_THREADS):
    two workers at two threads each on two cores ran the demo-scale tests several times
    slower than at one thread each, torch's OpenMP threads spinning while they wait."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        share = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = os.environ["ITERGRPO_MAX_THREADS"] = str(share)
        torch.set_num_threads(share)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Whole modules per worker, heaviest first (tests/xdist_scheduling.py)."""
    from tests.xdist_scheduling import ModuleUnitScheduling

    return ModuleUnitScheduling(config, log)


def shared_dir(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A directory every xdist worker of this test run sees under the same path (the
    session's own temp directory without xdist)."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run_id is None:
        return tmp_path_factory.mktemp(name)
    shared = tmp_path_factory.getbasetemp().parent / f"shared-{run_id[:12]}" / name
    shared.mkdir(parents=True, exist_ok=True)
    return shared


@pytest.fixture(scope="session")
def warm_start_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The warm-start cache of this test run (tests/warm_start_cache.py): one directory for
    every xdist worker and the CLI runs they start."""
    from tests.warm_start_cache import CACHE, ENV

    CACHE.directory = shared_dir(tmp_path_factory, "warm-starts")
    os.environ[ENV] = str(CACHE.directory)
    return CACHE.directory


@pytest.fixture(autouse=True)
def shared_warm_start(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, warm_start_cache: Path
) -> None:
    """In-process runs reuse an earlier identical warm start, except in tests marked
    `fresh_warm_start` (whose CLI runs train their own too)."""
    from tests.warm_start_cache import ENV, cached

    if request.node.get_closest_marker("fresh_warm_start") is not None:
        monkeypatch.delenv(ENV)
        return
    from flows.stages import warm_start as stage

    monkeypatch.setattr(stage, "warm_start", cached(stage.warm_start))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """How many warm starts the cache saved, in every process of the test run."""
    from tests.warm_start_cache import uses_summary

    base = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    found = [*base.glob("shared-*/warm-starts"), *base.glob("warm-starts*")]
    for directory in sorted({path.resolve() for path in found}):
        summary = uses_summary(directory)
        if summary:
            terminalreporter.write_line(f"warm starts: {summary}")


@pytest.fixture(scope="session")
def micro_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunStore, str]:
    """One completed `micro` run, shared by the tests that only read it (or copy its store);
    under xdist the first worker that needs it runs it and the others wait and read it."""
    from flows.loop import execute_run, planned_stages
    from tests.flow_helpers import micro_config

    root = shared_dir(tmp_path_factory, "micro-run")
    with FileLock(str(root) + ".lock"):
        if not (root / "complete").exists():
            cfg = micro_config(root / "store", "e2e")
            results = execute_run(cfg)
            assert [(r.stage, r.iteration) for r in results] == planned_stages(cfg)
            assert not any(r.skipped for r in results)
            (root / "complete").touch()
    return RunStore(root / "store"), "e2e"


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Tiny models run ~25x faster on one thread than on two contended cores; modules of
    tiny-model tests use it with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def preset_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The test's runs take their config's run.num_threads even under xdist (no
    ITERGRPO_MAX_THREADS cap): for bars measured at a preset's own threads, since CPU results
    depend on the thread count (the demo's ORM AUROC at 1 thread is not the 2-thread one)."""
    monkeypatch.delenv("ITERGRPO_MAX_THREADS", raising=False)
    threads = torch.get_num_threads()
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
