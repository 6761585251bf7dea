"""`itergrpo ablate` with and without forking, end to end on a cut-down Fig. 6 suite (the
micro preset, GRPO OS with the ORM retrained or trained once, one seed): the arm that differs
only in `reward_models.retrain` starts from the other's iteration 0 and the rollout and label
of its iteration 1, and every table comes out as computed in full (`--no-fork`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from flows.ablate.cost import PEAK_MIB, S_PER_STEP, STATE_MIB
from flows.cli import main
from storage.store import RunStore
from tests.flow_helpers import cli, snapshot

pytestmark = pytest.mark.slow
ABLATION = "ablate-fork"
SOURCE, FORKED = f"{ABLATION}-grpo_os-s0", f"{ABLATION}-grpo_os_rm_once-s0"
SUITE = {
    "description": "Fig. 6 in micro: the ORM retrained each iteration, or trained once.",
    "config": "micro",
    "seeds": 1,
    "overrides": ["evaluation.n_samples=8"],
    "arms": {
        "grpo_os": ["grpo.preset=grpo_os"],
        "grpo_os_rm_once": ["grpo.preset=grpo_os", "reward_models.retrain=false"],
    },
}
COSTS = (S_PER_STEP, PEAK_MIB, STATE_MIB)  # timings and memory: no two runs measure the same


def ablate(store: Path, suite: Path, *extra: str) -> tuple[str, float]:
    start = time.perf_counter()
    done = cli(store, "ablate", "--suite", str(suite), "--ablation-id", ABLATION, *extra)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr, time.perf_counter() - start


def results(store: Path) -> list[dict[str, Any]]:
    rows = RunStore(store).read("ablation", run_id=ABLATION).to_pylist()
    kept = [r for r in rows if r["metric"] not in COSTS]
    return sorted(kept, key=lambda r: (r["arm"], r["policy_iteration"], r["metric"], r["k"] or 0))


def test_forked_ablation_equals_the_one_computed_in_full(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = tmp_path / "fork.yaml"
    suite.write_text(yaml.safe_dump(SUITE))
    forked_store, full_store = tmp_path / "forked", tmp_path / "full"
    forked_log, forked_s = ablate(forked_store, suite)
    full_log, full_s = ablate(full_store, suite, "--no-fork")
    print(f"micro Fig. 6 suite, 1 seed: {forked_s:.0f} s forked, {full_s:.0f} s in full")

    line = f"arm grpo_os_rm_once, seed 0: forked warm_start..label of iteration 1 from {SOURCE}"
    assert line in forked_log
    assert "forked" not in full_log
    assert results(forked_store) == results(full_store)
    # not only the ablation's figures: every row of the forked run, as computed in full
    forked, full = RunStore(forked_store), RunStore(full_store)
    assert snapshot(forked, FORKED) == snapshot(full, FORKED)
    status = forked.run_status(FORKED)
    assert status["status"] == "completed"
    assert status["forked_from"] == {"run_id": SOURCE, "through": ["label", 1]}
    assert "forked_from" not in full.run_status(FORKED)
    assert main(["runs", "--store", str(forked_store)]) == 0
    listed = [line for line in capsys.readouterr().out.splitlines() if FORKED in line]
    assert len(listed) == 1 and f"{SOURCE} through label:1" in listed[0]
    # the forked stages are the source's commits; the rest were computed by the forked run
    commits = forked.committed_stages(FORKED)
    came_from = {(s["stage"], s["iteration"]): s["info"].get("forked_from") for s in commits}
    assert sum(v == SOURCE for v in came_from.values()) == 8
    assert came_from[("train_rm", 1)] is None
    assert [(s["stage"], s["iteration"]) for s in commits] == [
        (s["stage"], s["iteration"]) for s in full.committed_stages(FORKED)
    ]
