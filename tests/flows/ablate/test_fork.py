"""flows/ablate/run.py's fork step on a hand-made store: an arm-seed run with nothing committed
starts from the complete run of its seed that shares the most, never from another seed's,
never into a started run; a fork that fails leaves the run to compute everything."""

from __future__ import annotations

from pathlib import Path

import pytest

import storage.fork
from flows.ablate.run import fork_done_work
from flows.ablate.suites import ArmRun, load_suite, make_plan
from flows.loop import planned_stages
from storage.store import RunStore


def complete(store: RunStore, arm_run: ArmRun) -> None:
    """`arm_run` with every planned stage committed (a metrics row each)."""
    with store.open_run(arm_run.run_id, arm_run.config.model_dump(mode="json")) as run:
        for stage, iteration in planned_stages(arm_run.config):
            with run.stage(iteration, stage) as attempt:
                attempt.write("metrics", [{"stage": stage, "name": "x", "value": 1.0}])


def arm_runs(tmp_path: Path) -> dict[str, ArmRun]:
    name, suite = load_suite("micro")  # grpo_os, online_rft: they differ in grpo.* alone
    plan = make_plan(name, suite, seeds=2, ablation_id=None, store_root=tmp_path)
    return {f"{r.arm}-{r.seed}": r for r in plan.arm_runs()}


def test_an_arm_run_starts_from_the_evaluation_of_policy_0_at_its_seed(tmp_path: Path) -> None:
    runs = arm_runs(tmp_path)
    store = RunStore(tmp_path)
    complete(store, runs["grpo_os-1"])  # another seed: nothing to share
    assert fork_done_work(store, list(runs.values()), runs["online_rft-0"]) is None
    complete(store, runs["grpo_os-0"])
    said = fork_done_work(store, list(runs.values()), runs["online_rft-0"])
    assert said == "forked warm_start from ablate-micro-grpo_os-s0"
    forked = runs["online_rft-0"].run_id
    assert [(s["stage"], s["iteration"]) for s in store.committed_stages(forked)] == [
        ("warm_start", 0)
    ]
    # a started run resumes as it is
    assert fork_done_work(store, list(runs.values()), runs["online_rft-0"]) is None


def test_a_failed_fork_leaves_the_run_to_compute_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = arm_runs(tmp_path)
    store = RunStore(tmp_path)
    complete(store, runs["grpo_os-0"])

    def no_room(*args: object, **kwargs: object) -> None:
        raise OSError("no space left")

    monkeypatch.setattr(storage.fork, "atomic_write_parquet", no_room)
    said = fork_done_work(store, list(runs.values()), runs["online_rft-0"])
    assert said is not None and said.startswith("could not fork from ablate-micro-grpo_os-s0")
    assert store.committed_stages(runs["online_rft-0"].run_id) == []
