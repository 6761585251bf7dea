"""SIGKILL/SIGINT at several points of a `micro` run, resume each time: nothing lost or doubled.

The faults are injected with ITERGRPO_FAULT at a stage's progress reports, which sit after
its work and before its commit (mid-GRPO: between steps, after a step checkpoint). CPU runs
with one thread are deterministic, so the resumed run must equal an uninterrupted one
exactly (no tolerance), eval values included.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from flows.names import GRPO_PROGRESS
from storage.checkpoints import EXTRA_FILE, checkpoint_path
from storage.store import RunStore
from tests.flow_helpers import cli, snapshot

pytestmark = pytest.mark.slow
RUN_ID = "kr"


def committed(store: Path, run_id: str = RUN_ID) -> set[tuple[str, int]]:
    return {(s["stage"], s["iteration"]) for s in RunStore(store).committed_stages(run_id)}


def test_killed_and_resumed_run_equals_an_uninterrupted_one(
    micro_run: tuple[RunStore, str], tmp_path: Path
) -> None:
    # The uninterrupted reference is the session's micro run (same preset and seed; the
    # killed run takes its run id, since rollout rows name their checkpoint by run id).
    reference, run_id = micro_run
    want = snapshot(reference, run_id)

    store = tmp_path / "killed"
    first = cli(store, "run", "--config", "micro", "--run-id", run_id, fault="SIGKILL@rollout:0:1")
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    assert committed(store, run_id) == {("warm_start", 0)}

    for fault, stage in [
        ("SIGKILL@label:1:1", ("label", 1)),
        ("SIGKILL@train_rm:1:2", ("train_rm", 1)),  # ORM trained and saved, PRM not yet
        ("SIGKILL@grpo:1:2", ("grpo", 1)),  # step 0 checkpointed, step 1 not
        ("SIGKILL@evaluate:1:1", ("evaluate", 1)),
    ]:
        before = committed(store, run_id)
        result = cli(store, "resume", run_id, fault=fault)
        assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
        after = committed(store, run_id)
        assert stage not in after and before < after
        if stage == ("grpo", 1):
            progress = checkpoint_path(store, run_id, GRPO_PROGRESS, 1)
            assert json.loads((progress / EXTRA_FILE).read_text())["next_step"] == 1

    final = cli(store, "resume", run_id)
    assert final.returncode == 0, final.stderr[-2000:]
    assert "resuming at step 1" not in final.stderr  # that GRPO stage was already committed
    assert committed(store, run_id) == committed(reference.root, run_id)
    assert snapshot(RunStore(store), run_id) == want
    assert RunStore(store).run_status(run_id)["status"] == "completed"


def test_sigint_stops_at_a_safe_point_and_resume_finishes(tmp_path: Path) -> None:
    store = tmp_path / "store"
    args = ("run", "--config", "micro", "--run-id", RUN_ID, "--set", "run.iterations=1")
    stopped = cli(store, *args, fault="SIGINT@grpo:0:1")
    assert stopped.returncode == 130, stopped.stderr[-2000:]
    assert f"itergrpo resume {RUN_ID}" in stopped.stderr
    assert RunStore(store).run_status(RUN_ID)["status"] == "interrupted"
    assert ("grpo", 0) not in committed(store)
    resumed = cli(store, "resume", RUN_ID)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "GRPO: resuming at step 1" in resumed.stderr
    assert ("evaluate", 0) in committed(store)
