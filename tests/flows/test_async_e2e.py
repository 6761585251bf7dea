"""Asynchronous GRPO (grpo.async) end to end on `micro`: at max_staleness 0 the stored rows
are today's exactly; at 1 each step records the version that sampled its batch, none beyond
the bound, the decoupled objective's weights are stored, and a run killed mid-GRPO resumes to
exactly the uninterrupted one (the batch sampled ahead travels with the checkpoint)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.loop import execute_run
from flows.names import GRPO_PROGRESS
from flows.stages.grpo_progress import IN_FLIGHT_FILE
from grpo_core.algo.staleness import DROPPED, POLICY_VERSION, STALENESS
from storage.checkpoints import checkpoint_path
from storage.store import RunStore
from tests.flow_helpers import cli, killed_micro_run, micro_config, snapshot

pytestmark = pytest.mark.slow
RUN_ID = "async"
# one step off-policy, the decoupled objective (pi_prox / pi_behav truncated at 2)
SETTINGS = [
    "run.iterations=1",
    "grpo.async.max_staleness=1",
    "grpo.algo.rollout_correction.mode=tis",
]


@pytest.fixture(scope="module")
def async_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The store of one uninterrupted run at max_staleness 1: the metrics test reads it, the
    kill test resumes to it."""
    store = tmp_path_factory.mktemp("async")
    execute_run(micro_config(store, RUN_ID, *SETTINGS))
    return store


def per_step(store: Path) -> dict[int, dict[str, float]]:
    steps: dict[int, dict[str, float]] = {}
    for m in RunStore(store).read("metrics", run_id=RUN_ID).to_pylist():
        if m["stage"] == "grpo" and m["step"] is not None:
            steps.setdefault(m["step"], {})[m["name"]] = m["value"]
    return steps


def test_each_step_records_its_version_and_none_lies_beyond_the_bound(async_run: Path) -> None:
    steps = per_step(async_run)
    assert sorted(steps) == [0, 1, 2]
    assert [steps[s][POLICY_VERSION] for s in range(3)] == [0.0, 0.0, 1.0]
    assert [steps[s][STALENESS] for s in range(3)] == [0.0, 1.0, 1.0]
    assert all(steps[s][DROPPED] == 0.0 for s in range(3))
    # step 0 trains on its own policy's batch: pi_prox = pi_behav up to round-off; the later
    # ones on the previous policy's, whose weights the decoupled objective applies
    assert steps[0]["rollout_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert all(steps[s]["rollout_weight_raw_max"] != pytest.approx(1.0, abs=1e-6) for s in (1, 2))


def test_max_staleness_0_stores_todays_rows(
    micro_run: tuple[RunStore, str], tmp_path: Path
) -> None:
    reference, run_id = micro_run
    store = tmp_path / "sync"
    execute_run(micro_config(store, run_id, "grpo.async.max_staleness=0"))
    assert snapshot(RunStore(store), run_id) == snapshot(reference, run_id)
    names = {m["name"] for m in RunStore(store).read("metrics", run_id=run_id).to_pylist()}
    assert POLICY_VERSION not in names  # the synchronous stage stores no async figures


def test_a_run_killed_mid_grpo_resumes_exactly(async_run: Path, tmp_path: Path) -> None:
    store = tmp_path / "killed"
    killed_micro_run(store, RUN_ID, SETTINGS, "SIGKILL@grpo:0:2")  # step 0 checkpointed
    progress = checkpoint_path(store, RUN_ID, GRPO_PROGRESS, 0)
    in_flight = json.loads((progress / IN_FLIGHT_FILE).read_text())
    assert [(row["step"], row["version"]) for row in in_flight] == [(1, 0)]
    resumed = cli(store, "resume", RUN_ID)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "GRPO: resuming at step 1" in resumed.stderr
    assert snapshot(RunStore(store), RUN_ID) == snapshot(RunStore(async_run), RUN_ID)
    assert per_step(store)[2][POLICY_VERSION] == 1.0
