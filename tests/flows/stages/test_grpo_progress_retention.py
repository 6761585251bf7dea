"""Progress checkpoints (grpo-progress/iter-k) are removed once their GRPO stage is committed,
unless store.progress_checkpoints = keep; never before the commit, so a stage stopped mid-way
still resumes from its last one (tests/flows/test_kill_resume.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.names import GRPO_PROGRESS, POLICY
from flows.stages.grpo_progress import remove_committed_progress
from storage.checkpoints import checkpoint_path, checkpoints_of
from storage.store import RunStore


def progress_of(root: Path, iterations: range) -> None:
    for k in iterations:
        folder = checkpoint_path(root, "r", GRPO_PROGRESS, k)
        folder.mkdir(parents=True)
        (folder / "training_state.pt").write_bytes(b"x" * 100)


def test_only_the_checkpoints_of_committed_stages_are_removed(tmp_path: Path) -> None:
    progress_of(tmp_path, range(3))  # iteration 0's kept by a kill just after its commit
    removed = remove_committed_progress(tmp_path, "r", GRPO_PROGRESS, lambda k: k < 2)
    assert removed == [0, 1]
    assert [k for k, _ in checkpoints_of(tmp_path, "r", GRPO_PROGRESS)] == [2]
    # nothing half-removed is left beside it, under any name
    assert [p.name for p in (tmp_path / "checkpoints" / "r" / GRPO_PROGRESS).iterdir()] == [
        "iter-2"
    ]


@pytest.mark.slow
def test_a_completed_run_keeps_no_progress_checkpoint_by_default(
    micro_run: tuple[RunStore, str],
) -> None:
    store, run_id = micro_run
    assert checkpoints_of(store.root, run_id, GRPO_PROGRESS) == []
    assert len(checkpoints_of(store.root, run_id, POLICY)) > 1  # the policies stay
